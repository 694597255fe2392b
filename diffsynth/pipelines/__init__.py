"""The model families, one room each (``diffsynth/pipelines/<family>/``), and the registry of their specs.

Importing this package imports no model library: the pipeline classes below load on first use, and the registry
(``registry.families()``) reads each room's ``spec.py``, which is data. Importing it registers the families'
original-layout readers with the loader.
"""

from typing import TYPE_CHECKING

from ..core.lazy_exports import lazy_exports
from .registry import register_traits

__getattr__, __dir__ = lazy_exports(__name__, {
    ".flux": ("FluxPipeline",), ".flux2_klein": ("Flux2KleinPipeline",), ".ltx2": ("LTX2AudioVideoPipeline",),
    ".qwen_image": ("QwenImagePipeline",),
    ".stable_diffusion": ("StableDiffusionPipeline", "StableDiffusionXLPipeline"),
    ".wan_video": ("WanVideoPipeline",), ".z_image": ("ZImagePipeline",),
})

if TYPE_CHECKING:
    from .flux import FluxPipeline
    from .flux2_klein import Flux2KleinPipeline
    from .ltx2 import LTX2AudioVideoPipeline
    from .qwen_image import QwenImagePipeline
    from .stable_diffusion import StableDiffusionPipeline, StableDiffusionXLPipeline
    from .wan_video import WanVideoPipeline
    from .z_image import ZImagePipeline

register_traits()

__all__ = ["Flux2KleinPipeline", "FluxPipeline", "LTX2AudioVideoPipeline", "QwenImagePipeline",
           "StableDiffusionPipeline", "StableDiffusionXLPipeline", "WanVideoPipeline", "ZImagePipeline"]
