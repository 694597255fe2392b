"""The run's flags: one frozen section per concern, each owning its argparse group and its checks, put together and
checked across sections by ``RunConfig``; the parser, and the reference trainer's flags."""

from typing import TYPE_CHECKING

from ...core.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    ".parsers": ("build_parser", "parse_args"),
    ".run_config": ("RunConfig",),
    ".sections": ("SECTIONS",),
})

if TYPE_CHECKING:
    from .parsers import build_parser, parse_args
    from .run_config import RunConfig
    from .sections import SECTIONS

__all__ = ["SECTIONS", "RunConfig", "build_parser", "parse_args"]
