"""The run's flags: one frozen section per concern, each owning its argparse group and its checks, put together and
checked across sections by ``RunConfig``; the parser, and the reference trainer's flags."""

from .parsers import build_parser, parse_args
from .run_config import SECTIONS, RunConfig

__all__ = ["SECTIONS", "RunConfig", "build_parser", "parse_args"]
