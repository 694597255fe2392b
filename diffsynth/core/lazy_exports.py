"""Package attributes imported on first use, so that importing one light submodule does not import the whole package.

A package ``__init__`` that re-exports names from heavy submodules (torch, diffusers) would make every import below it
pay for them: the trainer's flag parser, for one, must answer a misspelled flag before torch is imported. Such an
``__init__`` lists where each name lives and repeats the imports under ``TYPE_CHECKING`` for readers and checkers::

    __getattr__, __dir__ = lazy_exports(__name__, {".entry": ("main",), ".errors": ("FlagError",)})
    if TYPE_CHECKING:
        from .entry import main
        from .errors import FlagError
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, Sequence[str]]) -> tuple[Callable[[str], Any], Callable[[], list]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package`` for the names in ``exports``.

    Args:
        package: The package's ``__name__``.
        exports: Each relative submodule (``".entry"``) and the names it defines that the package exports.
    """
    submodule_of = {name: submodule for submodule, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in submodule_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(submodule_of[name], package), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    def __dir__() -> list:
        return sorted({*vars(sys.modules[package]), *submodule_of})

    return __getattr__, __dir__
