"""Wan VACE: the control context ``WanVACETransformer3DModel`` reads, as diffusers' ``WanVACEPipeline`` builds it.

The call takes the reference trainer's names, with diffusers' meaning:

- ``vace_video``: frames to condition on (default: black frames);
- ``vace_video_mask``: frames, white where the model generates and black where it keeps ``vace_video`` (default: all
  white); binarised at one half for the video and folded 8x8 into 64 channels for the mask;
- ``vace_reference_image``: one image or a list, each fitted into the frame on a white canvas; their latents come
  before the video's, the denoised latents carry as many extra leading frames, and those are dropped before decoding.

The context is ``[inactive latents, reactive latents, folded mask]`` along channels (16 + 16 + 64 = 96). In training
the reference images' latents are also prepended to the target latents, as the reference trainer does, so the frames
the model learns to produce line up with the context.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from PIL import Image

from ...diffusion.base_pipeline import PipelineUnit
from ..common import draw_noise, image_to_tensor, video_to_tensor
from .units import VAE_TEMPORAL_SCALE, normalised_latents, round_frames

if TYPE_CHECKING:
    from .pipeline import WanVideoPipeline

VACE_INPUTS = ("vace_video", "vace_video_mask", "vace_reference_image")
# Pixels per latent pixel of the Wan2.1 VAE, which every VACE release uses; the mask is folded by it.
SPATIAL_SCALE = 8


def reference_images(value: Any) -> list[Image.Image]:
    """``vace_reference_image`` as a list of PIL images (one image or a list of them; None gives none).

    Raises:
        TypeError: Something else, named with how to load an image.
    """
    if value is None:
        return []
    images = list(value) if isinstance(value, (list, tuple)) else [value]
    if not images or not all(isinstance(image, Image.Image) for image in images):
        raise TypeError(f"vace_reference_image must be one PIL image or a list of them, got {type(value).__name__}; "
                        "load it with PIL.Image.open(path)")
    return images


def control_frames(value: Any, name: str, num_frames: int, width: int, height: int) -> list[Image.Image]:
    """The first ``num_frames`` frames of a control video named ``name``, resized (LANCZOS) to ``width x height``.

    Raises:
        TypeError: ``value`` is not a list of PIL frames.
        ValueError: It has fewer than ``num_frames`` frames.
    """
    if not isinstance(value, (list, tuple)) or not all(isinstance(frame, Image.Image) for frame in value):
        raise TypeError(f"{name} must be a list of PIL frames, got {type(value).__name__}; read a video with "
                        "diffsynth.core.data.LoadVideo or pass [PIL.Image.open(path) for path in frame_paths]")
    if len(value) < num_frames:
        raise ValueError(f"{name} has {len(value)} frames, fewer than num_frames={num_frames}; pass "
                         f"num_frames={round_frames(len(value))} or a longer {name}")
    return [frame.convert("RGB") if frame.size == (width, height) else
            frame.convert("RGB").resize((width, height), Image.Resampling.LANCZOS) for frame in value[:num_frames]]


def fitted_reference(image: Image.Image, height: int, width: int) -> torch.Tensor:
    """A reference image scaled to fit ``height x width`` and centred on a white canvas, ``(3, H, W)`` in ``[-1, 1]``
    (diffusers' ``preprocess_conditions``: sizes first rounded down to multiples of 8, then bilinear scaling)."""
    image = image.convert("RGB")
    rounded = (image.width // SPATIAL_SCALE * SPATIAL_SCALE, image.height // SPATIAL_SCALE * SPATIAL_SCALE)
    if rounded != image.size:
        image = image.resize(rounded, Image.Resampling.LANCZOS)
    pixels = image_to_tensor(image)
    scale = min(height / image.height, width / image.width)
    new_height, new_width = int(image.height * scale), int(image.width * scale)
    resized = torch.nn.functional.interpolate(pixels, size=(new_height, new_width), mode="bilinear",
                                              align_corners=False)[0]
    canvas = torch.ones(3, height, width)
    top, left = (height - new_height) // 2, (width - new_width) // 2
    canvas[:, top:top + new_height, left:left + new_width] = resized
    return canvas


def folded_mask(mask: torch.Tensor) -> torch.Tensor:
    """A ``(1, 3, F, H, W)`` mask in ``[0, 1]`` as ``(1, 64, latent frames, H / 8, W / 8)``: each 8x8 pixel patch
    becomes 64 channels, and the frames are picked to the latent frame count (nearest)."""
    frames, height, width = mask.shape[2:]
    folded = mask[0, 0].reshape(frames, height // SPATIAL_SCALE, SPATIAL_SCALE, width // SPATIAL_SCALE, SPATIAL_SCALE)
    folded = folded.permute(2, 4, 0, 1, 3).flatten(0, 1)
    size = ((frames + VAE_TEMPORAL_SCALE - 1) // VAE_TEMPORAL_SCALE, *folded.shape[2:])
    return torch.nn.functional.interpolate(folded.unsqueeze(0), size=size, mode="nearest-exact")


class VaceUnit(PipelineUnit):
    """Encodes the VACE inputs into ``vace_context`` (None for a transformer without VACE blocks, which then refuses
    them), and with reference images lengthens the noise and, in training, the target latents by their frames.

    ``vace_reference_frames`` tells ``decode`` how many leading latent frames to drop. ``noise`` and
    ``input_latents`` pass through unchanged without reference images.
    """

    def __init__(self) -> None:
        super().__init__(input_params=(*VACE_INPUTS, "height", "width", "num_frames", "seed", "rand_device", "noise",
                                       "input_latents"),
                         output_params=("vace_context", "vace_reference_frames", "noise", "input_latents"),
                         onload_model_names=("vae",))

    def process(self, pipe: WanVideoPipeline, vace_video: Sequence[Image.Image] | None,
                vace_video_mask: Sequence[Image.Image] | None, vace_reference_image: Any, height: int, width: int,
                num_frames: int, seed: int | None, rand_device: Any, noise: torch.Tensor | None,
                input_latents: torch.Tensor | None) -> dict:
        given = [name for name, value in zip(VACE_INPUTS, (vace_video, vace_video_mask, vace_reference_image))
                 if value is not None]
        takes = pipe.takes_vace()  # unknown (None) in a stage without the transformer: the inputs decide
        if takes is False or (takes is None and not given):
            if given:
                raise ValueError(f"{', '.join(given)} given, but {pipe.describe_transformer()} has no VACE blocks; "
                                 "load a VACE model (e.g. Wan-AI/Wan2.1-VACE-1.3B) or drop them")
            return {"vace_context": None, "vace_reference_frames": 0, "noise": noise, "input_latents": input_latents}
        if vace_video_mask is not None and vace_video is None:
            raise ValueError("vace_video_mask was given without vace_video; the mask marks which parts of "
                             "vace_video to keep: pass both")
        references = reference_images(vace_reference_image)
        if vace_video is None:
            video = torch.zeros(1, 3, num_frames, height, width)
        else:
            video = video_to_tensor(control_frames(vace_video, "vace_video", num_frames, width, height))
        if vace_video_mask is None:
            mask = torch.ones_like(video)
        else:
            mask_frames = control_frames(vace_video_mask, "vace_video_mask", num_frames, width, height)
            mask = (video_to_tensor(mask_frames) + 1) / 2
        mask = mask.clamp(0, 1)
        keep = (mask > 0.5).to(video.dtype)
        latents = torch.cat([normalised_latents(pipe, video * (1 - keep)), normalised_latents(pipe, video * keep)],
                            dim=1)
        folded = folded_mask(mask).to(latents)
        reference_latents = []
        for image in references:  # each one goes before those already placed, as diffusers does
            encoded = normalised_latents(pipe, fitted_reference(image, height, width)[None, :, None])
            reference_latents.insert(0, encoded)
            latents = torch.cat([torch.cat([encoded, torch.zeros_like(encoded)], dim=1), latents], dim=2)
            folded = torch.cat([torch.zeros_like(folded[:, :, :1]), folded], dim=2)
        outputs = {"vace_context": torch.cat([latents, folded], dim=1).to(pipe.torch_dtype),
                   "vace_reference_frames": len(references), "noise": noise, "input_latents": input_latents}
        if references:
            shape = pipe.latent_shape(height, width, num_frames)
            outputs["noise"] = draw_noise(pipe, (*shape[:2], shape[2] + len(references), *shape[3:]), seed,
                                          rand_device) if noise is not None else None
            if input_latents is not None:
                outputs["input_latents"] = torch.cat([*reference_latents, input_latents.float()], dim=2).to(
                    input_latents.dtype)
        return outputs


def vace_inputs(dit: torch.nn.Module, vace_context: torch.Tensor, vace_scale: float | None) -> dict[str, Any]:
    """The keyword inputs a ``WanVACETransformer3DModel`` takes for the context: the context in its dtype, and the
    hint scale of every VACE layer (``vace_scale``, default 1)."""
    scale = None
    if vace_scale not in (None, 1, 1.0):
        scale = torch.full((len(dit.config.vace_layers),), float(vace_scale), device=vace_context.device)
    return {"control_hidden_states": vace_context.to(dit.dtype), "control_hidden_states_scale": scale}
