"""Model families built from units: one module per family."""

from .qwen_image import QwenImagePipeline
from .wan_video import WanVideoPipeline

__all__ = ["QwenImagePipeline", "WanVideoPipeline"]
