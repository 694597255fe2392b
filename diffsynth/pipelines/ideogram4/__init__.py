"""Ideogram 4: the family's room (its pipeline; the trainer refuses the release for now).

The pipeline's public names are imported on first use, so that importing the room imports no model library.
"""

from typing import TYPE_CHECKING

from ...core.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {".pipeline": ["Ideogram4Pipeline", "ModelConfig"]})

if TYPE_CHECKING:
    from .pipeline import Ideogram4Pipeline, ModelConfig

__all__ = ["Ideogram4Pipeline", "ModelConfig"]
