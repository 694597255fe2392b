"""In-context control for Qwen-Image: ``context_image``, the reference implementation's input for
Qwen-Image-In-Context-Control-Union (a LoRA on Qwen-Image) and Qwen-Image-Layered-Control-V2 (a LoRA on the
Layered-Control transformer).

diffusers has no such input. As the reference does, the control image (a pose, an edge map, a depth map, a mask) is
resized to the output size, encoded into normalised latents and packed 2x2 into tokens that the transformer reads
right after the generated image's tokens (before any edit image or layer input image), with an ``img_shapes`` entry
of its own: its rope positions are those of one more frame (a plain Qwen-Image transformer), or one more layer
(Layered's 3D rope). The prediction keeps only the generated tokens, so the control image steers the output without
being generated. With a four-channel (RGBA) VAE the image is read as RGBA.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PIL import Image

from ...diffusion.base_pipeline import PipelineUnit
from .layered import encode_frames

if TYPE_CHECKING:
    from .pipeline import QwenImagePipeline


class ContextImageUnit(PipelineUnit):
    """Encodes ``context_image``, resized to ``height x width`` as the reference resizes it (PIL's default bicubic
    filter), into normalised latents ``(1, 16, H/8, W/8)``; ``None`` without one."""

    def __init__(self) -> None:
        super().__init__(input_params=("context_image", "height", "width"), output_params=("context_latents",),
                         onload_model_names=("vae",))

    def process(self, pipe: QwenImagePipeline, context_image: Image.Image | None, height: int, width: int) -> dict:
        if context_image is None:
            return {"context_latents": None}
        if context_image.size != (width, height):
            context_image = context_image.resize((width, height))
        return {"context_latents": encode_frames(pipe, [context_image])[:, :, 0]}
