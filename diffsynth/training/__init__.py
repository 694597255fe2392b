"""The trainer: ``main`` runs one task stage from the flags; ``cli`` is every ``train.py``'s entry.

The package's folders name its roles: ``config/`` (the flags and their checks), ``placement/`` (where weights
live), ``objective/`` (what is learned), ``loop/`` (the recipe and what it calls each step), ``outputs/`` (what a
run writes and reads back), ``startup/`` (what is checked and built before the first step); ``launch`` and
``exit_codes`` are how a run is started and how it ends.
"""

from .entry import cli, main
from .errors import FlagError

__all__ = ["FlagError", "cli", "main"]
