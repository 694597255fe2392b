"""Model families built from units: one module per family."""

from .flux import FluxPipeline
from .flux2_klein import Flux2KleinPipeline
from .qwen_image import QwenImagePipeline
from .wan_video import WanVideoPipeline
from .z_image import ZImagePipeline

__all__ = ["Flux2KleinPipeline", "FluxPipeline", "QwenImagePipeline", "WanVideoPipeline", "ZImagePipeline"]
