"""Exceptions raised by the data package.

Each subclasses the built-in exception a caller would naturally catch (``ValueError`` for bad flags or bad file
contents, ``FileNotFoundError`` for missing files), so code that does not know this package still handles them, while
the runner and tests can tell a dataset problem from a cache problem.
"""

from __future__ import annotations


class DatasetError(ValueError):
    """A dataset flag (``--height``, ``--max_pixels``, ...) or the metadata / data files it names are unusable."""


class MissingColumnsError(DatasetError):
    """The metadata lacks columns every row needs; ``missing`` and ``found`` name them, so a caller that knows what
    the columns are for (the trainer: images or videos) can say more than "rename"."""

    def __init__(self, message: str, missing: list[str], found: list[str]) -> None:
        super().__init__(message)
        self.missing, self.found = missing, found


class DataFileNotFoundError(FileNotFoundError):
    """The metadata file, or a data file one of its rows names, is not on disk."""


class CacheError(ValueError):
    """A stage-1 cache folder or file is missing, corrupt, or was made for another model or set of units."""
