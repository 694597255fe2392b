"""Stable Diffusion 1.x and SDXL: the family's room (its spec, pipelines and units) on diffusers'
``UNet2DConditionModel``.

The pipeline's public names are imported on first use, so that reading the family's spec imports no model library.
"""

from typing import TYPE_CHECKING

from ...core.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {".pipeline": ["ModelConfig", "StableDiffusionPipeline"],
                                                ".xl": ["StableDiffusionXLPipeline"]})

if TYPE_CHECKING:
    from .pipeline import ModelConfig, StableDiffusionPipeline
    from .xl import StableDiffusionXLPipeline

__all__ = ["ModelConfig", "StableDiffusionPipeline", "StableDiffusionXLPipeline"]
