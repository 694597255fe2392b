"""Qwen-Image-Layered: what decomposing an image into RGBA layers adds to the Qwen-Image pipeline.

The behaviour is diffusers' ``QwenImageLayeredPipeline``, with the reference implementation's inputs
(``layer_input_image``, ``layer_num``):

- The release's VAE reads and writes four channels (RGBA). The input image is encoded into normalised latents that
  the transformer reads after the generated tokens, with an ``img_shapes`` entry of its own, as an edit image is.
- ``layer_num`` layers are generated together with the composite: ``layer_num + 1`` frames of latents, held in the
  state as ``(batch, 16, layer_num + 1, height / 8, width / 8)`` (diffusers' unpacked layout), packed frame after
  frame into one token sequence. The transformer's 3D rope (``use_layer3d_rope``) tells the frames apart, and its
  extra timestep condition (``use_additional_t_cond``) is given 0, as diffusers does.
- The schedule's shift follows the input image's token count: ``mu = sqrt(tokens / 256)``.
- CFG is plain (diffusers' default ``cfg_normalize=False``).
- Decoding returns every frame, the composite first, as the reference implementation does; diffusers returns the
  layers only (frames 1 onward).

In training, a sample's ``image`` is a list: the composite, then the layers; the loss covers every frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from PIL import Image

from ...diffusion.base_pipeline import PipelineUnit
from ..common import InputImageEmbedderUnit, draw_noise, pack_latents, unpack_latents

if TYPE_CHECKING:
    from .pipeline import QwenImagePipeline

# diffusers' default output area for a layered decomposition (its ``resolution=640`` bucket).
LAYERED_DEFAULT_PIXELS = 640 * 640
# Tokens at which the schedule's ``mu`` is 1 (diffusers: 256 * 256 / 16 / 16).
LAYERED_BASE_TOKENS = 256


def vae_image_tensor(pipe: QwenImagePipeline, image: Image.Image) -> torch.Tensor:
    """``image`` as a ``(1, C, 1, H, W)`` tensor in ``[-1, 1]`` for the VAE: RGBA for a four-channel VAE
    (Qwen-Image-Layered), else RGB."""
    # Only Qwen-Image's VAE names its input channels; the Wan VAE other rooms borrow this for is RGB.
    mode = "RGBA" if getattr(pipe.vae.config, "input_channels", 3) == 4 else "RGB"
    array = np.asarray(image.convert(mode), dtype=np.float32) / 255.0
    tensor = torch.from_numpy(array).permute(2, 0, 1).unsqueeze(0) * 2.0 - 1.0
    return tensor.to(pipe.device, pipe.vae.dtype).unsqueeze(2)


def layered_mu(height: int, width: int) -> float:
    """The schedule's exponential-shift ``mu`` for a decomposition at ``height x width`` pixels (diffusers' rule)."""
    return ((height // 16) * (width // 16) / LAYERED_BASE_TOKENS) ** 0.5


def check_layer_num(layer_num: int | None, layer_input_image: Image.Image | None) -> None:
    """Raises ValueError unless ``layer_num`` and ``layer_input_image`` come together, ``layer_num`` an int of at least
    0 (0: Qwen-Image-Layered-Control's one extracted layer)."""
    if (layer_num is None) != (layer_input_image is None):
        raise ValueError(f"layer_num={layer_num!r} with layer_input_image={'set' if layer_input_image else None}: "
                         "Qwen-Image-Layered needs both (the RGBA image to decompose and the number of layers)")
    if layer_num is not None and (isinstance(layer_num, bool) or not isinstance(layer_num, int) or layer_num < 0):
        raise ValueError(f"layer_num={layer_num!r} must be a number of layers, e.g. layer_num=3 (Qwen-Image-Layered), "
                         "or 0 to extract one layer (Qwen-Image-Layered-Control)")


class LayeredNoiseUnit(PipelineUnit):
    """The initial noise: ``(1, 16, H/8, W/8)``, or for a decomposition ``(1, 16, layer_num + 1, H/8, W/8)``, drawn
    frame-major as diffusers draws it so that one seed gives both the same noise."""

    def __init__(self) -> None:
        super().__init__(input_params=("height", "width", "seed", "rand_device", "layer_num"), output_params=("noise",))

    def process(self, pipe: QwenImagePipeline, height: int, width: int, seed: int | None,
                rand_device: str | torch.device | None, layer_num: int | None) -> dict:
        scale, channels = pipe.pixels_per_latent, pipe.latent_channels
        if layer_num is None:
            return {"noise": draw_noise(pipe, (1, channels, height // scale, width // scale), seed, rand_device)}
        noise = draw_noise(pipe, (1, layer_num + 1, channels, height // scale, width // scale), seed, rand_device)
        return {"noise": noise.transpose(1, 2)}


class LayeredInputImageUnit(InputImageEmbedderUnit):
    """``InputImageEmbedderUnit``, which also takes a list of images (a layered training sample: the composite, then
    the layers) and encodes it into ``(1, 16, frames, H/8, W/8)`` latents."""

    def process(self, pipe: QwenImagePipeline, input_image: Image.Image | Sequence[Image.Image] | None, height: int,
                width: int) -> dict:
        if not isinstance(input_image, (list, tuple)):
            return super().process(pipe, input_image, height, width)
        images = [image if image.size == (width, height) else image.resize((width, height), Image.Resampling.LANCZOS)
                  for image in input_image]
        return {"input_latents": encode_frames(pipe, images)}


class LayerInputImageUnit(PipelineUnit):
    """Encodes ``layer_input_image`` (RGBA), resized to ``height x width`` if it differs, into normalised latents
    ``(1, 16, H/8, W/8)`` (the VAE's distribution mode, as diffusers uses)."""

    def __init__(self) -> None:
        super().__init__(input_params=("layer_input_image", "height", "width"),
                         output_params=("layer_input_latents",), onload_model_names=("vae",))

    def process(self, pipe: QwenImagePipeline, layer_input_image: Image.Image | None, height: int,
                width: int) -> dict:
        if layer_input_image is None:
            return {"layer_input_latents": None}
        if layer_input_image.size != (width, height):
            layer_input_image = layer_input_image.resize((width, height), Image.Resampling.LANCZOS)
        return {"layer_input_latents": encode_frames(pipe, [layer_input_image])[:, :, 0]}


def encode_frames(pipe: QwenImagePipeline, images: Sequence[Image.Image]) -> torch.Tensor:
    """Images of one size, each encoded on its own, as normalised latents ``(1, 16, frames, H/8, W/8)``."""
    frames = [pipe.vae.encode(vae_image_tensor(pipe, image)).latent_dist.mode() for image in images]
    latents = torch.cat(frames, dim=2)
    mean, inverse_std = pipe.latent_statistics(latents)
    return ((latents - mean) * inverse_std).to(pipe.torch_dtype)


def pack_frames(latents: torch.Tensor) -> torch.Tensor:
    """``(B, C, F, H, W)`` latents to ``(B, F * H/2 * W/2, C * 4)`` tokens, frame after frame."""
    batch, channels, frames, height, width = latents.shape
    tokens = pack_latents(latents.transpose(1, 2).reshape(batch * frames, channels, height, width))
    return tokens.reshape(batch, -1, tokens.shape[-1])


def unpack_frames(tokens: torch.Tensor, frames: int, height: int, width: int) -> torch.Tensor:
    """Inverse of ``pack_frames``."""
    batch, _, features = tokens.shape
    latents = unpack_latents(tokens.reshape(batch * frames, -1, features), height, width)
    return latents.reshape(batch, frames, *latents.shape[1:]).transpose(1, 2)


def decode_frames(pipe: QwenImagePipeline, latents: torch.Tensor) -> torch.Tensor:
    """``(1, 16, F, h, w)`` latents decoded frame by frame (as diffusers does): ``(F, C, H, W)`` values in [0, 1]."""
    frames = latents[0].transpose(0, 1).unsqueeze(2).to(pipe.vae.dtype)  # (F, 16, 1, h, w)
    mean, inverse_std = pipe.latent_statistics(frames)
    images = pipe.vae.decode(frames / inverse_std + mean, return_dict=False)[0][:, :, 0]
    return (images / 2 + 0.5).clamp(0, 1)
