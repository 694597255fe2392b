"""Model families built from units: one module per family."""

from .qwen_image import QwenImagePipeline

__all__ = ["QwenImagePipeline"]
