"""Exceptions raised by the model loader.

Each one subclasses the built-in exception a caller would naturally catch (``ValueError`` for bad flags,
``FileNotFoundError`` for missing files, ``RuntimeError`` for a checkpoint that does not fit its model), so code that
does not know this package still handles them sensibly, while tests and the CLI can tell them apart.
"""

from __future__ import annotations


class ModelConfigError(ValueError):
    """A model flag (``--model_id_with_origin_paths``, ``--model_paths``) or a ``ModelConfig`` is malformed."""


class ModelFilesNotFoundError(FileNotFoundError):
    """The files a ``ModelConfig`` names are not on disk and could not (or may not) be downloaded."""


class ModelLoadError(RuntimeError):
    """The files were found but do not make a model: corrupt shard, unknown class, missing or mismatched weights."""
