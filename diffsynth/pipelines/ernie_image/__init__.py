"""ERNIE-Image (and ERNIE-Image-Turbo): the family's room (its spec and pipeline).

The pipeline's public names are imported on first use, so that reading the family's spec imports no model library.
"""

from typing import TYPE_CHECKING

from ...core.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {".pipeline": ["ErnieImagePipeline", "ModelConfig"]})

if TYPE_CHECKING:
    from .pipeline import ErnieImagePipeline, ModelConfig

__all__ = ["ErnieImagePipeline", "ModelConfig"]
