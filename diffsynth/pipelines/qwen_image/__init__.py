"""Qwen-Image and Qwen-Image-Edit: the family's room (its spec, pipeline, units and original-layout readers).

The pipeline's public names are imported on first use, so that reading the family's spec imports no model library.
"""

from typing import TYPE_CHECKING

from ...core.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {".pipeline": ["ControlNetInput", "ModelConfig", "QwenImagePipeline"]})

if TYPE_CHECKING:
    from .pipeline import ControlNetInput, ModelConfig, QwenImagePipeline

__all__ = ["ControlNetInput", "ModelConfig", "QwenImagePipeline"]
