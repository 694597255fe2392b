"""Krea 2 (Krea-2-Raw and Krea-2-Turbo): the family's room (its spec, pipeline and original-layout reader).

The pipeline's public names are imported on first use, so that reading the family's spec imports no model library.
"""

from typing import TYPE_CHECKING

from ...core.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {".pipeline": ["Krea2Pipeline", "ModelConfig"]})

if TYPE_CHECKING:
    from .pipeline import Krea2Pipeline, ModelConfig

__all__ = ["Krea2Pipeline", "ModelConfig"]
