"""The trainer: ``main`` runs one task stage from the flags; ``cli`` is every ``train.py``'s entry.

The package's folders name its roles: ``config/`` (the flags and their checks), ``placement/`` (where weights
live), ``objective/`` (what is learned), ``loop/`` (the recipe and what it calls each step), ``outputs/`` (what a
run writes and reads back), ``startup/`` (what is checked and built before the first step); ``launch`` and
``exit_codes`` are how a run is started and how it ends.
"""

from typing import TYPE_CHECKING

from ..core.lazy_exports import lazy_exports

# Lazy, so that the flag parser below (diffsynth.training.config) answers a flag error before torch is imported.
__getattr__, __dir__ = lazy_exports(__name__, {".command_line": ("cli",), ".entry": ("main",),
                                               ".config.errors": ("FlagError",)})

if TYPE_CHECKING:
    from .command_line import cli
    from .config.errors import FlagError
    from .entry import main

__all__ = ["FlagError", "cli", "main"]
