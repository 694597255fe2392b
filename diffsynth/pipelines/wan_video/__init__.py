"""Wan2.1 and Wan2.2 (text-, image- and text-image-to-video): the family's room (its spec, pipeline, units and original-layout readers).

The pipeline's public names are imported on first use, so that reading the family's spec imports no model library.
"""

from typing import TYPE_CHECKING

from ...core.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {".pipeline": ["ModelConfig", "WanVideoPipeline", "save_video"]})

if TYPE_CHECKING:
    from .pipeline import ModelConfig, WanVideoPipeline, save_video

__all__ = ["ModelConfig", "WanVideoPipeline", "save_video"]
