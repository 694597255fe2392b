"""The units of a Wan video's inputs that the image conditioning (``wan_image.py``) leaves: the frame count, the
noise, the input video's latents and the UMT5 prompt embeddings, as diffusers' ``WanPipeline`` computes them.
"""

from __future__ import annotations

import html
import logging
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from PIL import Image

from ...diffusion.base_pipeline import PipelineUnit
from ..common import PromptUnit, draw_noise, video_to_tensor

if TYPE_CHECKING:
    from .pipeline import WanVideoPipeline

logger = logging.getLogger(__name__)

VAE_TEMPORAL_SCALE = 4
_PATCH_SIZE = 2  # the Wan transformers' 2x2 patch


def clean_prompt(text: str) -> str:
    """Unescapes HTML entities and collapses whitespace, as diffusers does before tokenising (ftfy aside)."""
    try:
        import ftfy

        text = ftfy.fix_text(text)
    except ImportError:
        pass
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


def normalised_latents(pipe: WanVideoPipeline, pixels: torch.Tensor) -> torch.Tensor:
    """``(1, 3, F, H, W)`` pixels in ``[-1, 1]`` as the VAE's normalised float32 latents (its distribution's mode,
    so a cached latent equals the one a single-stage run computes)."""
    latents = pipe.vae.encode(pixels.to(pipe.device, pipe.vae.dtype)).latent_dist.mode().float()
    mean, inverse_std = pipe.latent_statistics(latents)
    return (latents - mean) * inverse_std


def round_frames(num_frames: int) -> int:
    """The largest count of the form 4k+1 not above ``num_frames`` (at least 1)."""
    return max(1, (int(num_frames) - 1) // VAE_TEMPORAL_SCALE * VAE_TEMPORAL_SCALE + 1)


class FrameCountUnit(PipelineUnit):
    """Rounds ``num_frames`` down to the form 4k+1 that the VAE's 4x temporal compression needs, with a warning."""

    def __init__(self) -> None:
        super().__init__(input_params=("num_frames",), output_params=("num_frames",))

    def process(self, pipe: WanVideoPipeline, num_frames: int) -> dict:
        if not isinstance(num_frames, int) or num_frames < 1:
            raise ValueError(f"num_frames={num_frames!r} must be a positive frame count of the form 4k+1, e.g. 81")
        rounded = round_frames(num_frames)
        if rounded != num_frames:
            logger.warning("num_frames=%d is not of the form 4k+1; using %d", num_frames, rounded)
        return {"num_frames": rounded}


class NoiseUnit(PipelineUnit):
    """Draws the initial noise ``(1, C, (num_frames - 1) / 4 + 1, height / s, width / s)`` (the VAE's latent channels
    ``C`` and spatial compression ``s``); with ``animate2_reference_video`` one latent frame more, the character's
    (drawn at the full length, as the reference draws it)."""

    def __init__(self) -> None:
        super().__init__(input_params=("height", "width", "num_frames", "seed", "rand_device",
                                       "animate2_reference_video"), output_params=("noise",))

    def process(self, pipe: WanVideoPipeline, height: int, width: int, num_frames: int, seed: int | None,
                rand_device: str | torch.device | None, animate2_reference_video: list | None) -> dict:
        shape = list(pipe.latent_shape(height, width, num_frames))
        shape[2] += animate2_reference_video is not None
        return {"noise": draw_noise(pipe, tuple(shape), seed, rand_device)}


class InputVideoEmbedderUnit(PipelineUnit):
    """Encodes ``input_video`` (a list of frames) with the Wan VAE into normalised latents.

    Frames are resized to ``height x width`` if they differ, and the first ``num_frames`` are used. The VAE's
    distribution mode is used rather than a sample, so a cached latent equals the one a single-stage run computes.
    """

    def __init__(self) -> None:
        super().__init__(input_params=("input_video", "height", "width", "num_frames"),
                         output_params=("input_latents",), onload_model_names=("vae",))

    def process(self, pipe: WanVideoPipeline, input_video: Sequence[Image.Image] | None, height: int, width: int,
                num_frames: int) -> dict:
        if input_video is None:
            return {}
        if len(input_video) < num_frames:
            raise ValueError(f"input_video has {len(input_video)} frames, fewer than num_frames={num_frames}; pass "
                             f"num_frames={round_frames(len(input_video))} or a longer video")
        frames = [frame if frame.size == (width, height) else frame.resize((width, height), Image.Resampling.LANCZOS)
                  for frame in input_video[:num_frames]]
        pixels = video_to_tensor(frames).to(pipe.device, pipe.vae.dtype)
        latents = pipe.vae.encode(pixels).latent_dist.mode()
        mean, inverse_std = pipe.latent_statistics(latents)
        return {"input_latents": ((latents - mean) * inverse_std).to(pipe.torch_dtype)}


class PromptEmbedderUnit(PromptUnit):
    """Encodes the prompt (and, with CFG, the negative prompt) with UMT5.

    The embeddings of the real tokens are kept and zero-padded to ``max_sequence_length``, as the model was trained.
    """

    text_encoder_entry = "<model_id>:text_encoder/model*.safetensors"

    def process(self, pipe: WanVideoPipeline, prompt: str | None, max_sequence_length: int | None) -> dict:
        self.require_text_encoder(pipe)
        length = max_sequence_length or 512
        tokens = pipe.tokenizer([clean_prompt(prompt or "")], padding="max_length", max_length=length,
                                truncation=True, add_special_tokens=True, return_attention_mask=True,
                                return_tensors="pt")
        ids, mask = tokens.input_ids.to(pipe.device), tokens.attention_mask.to(pipe.device)
        hidden = pipe.text_encoder(ids, mask).last_hidden_state
        kept = int(mask.gt(0).sum())
        embeddings = torch.zeros_like(hidden)
        embeddings[:, :kept] = hidden[:, :kept]
        return {"prompt_emb": embeddings.to(pipe.torch_dtype)}


def first_frame_inputs(hidden: torch.Tensor, timestep: torch.Tensor,
                       first_frame_latents: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token timesteps ``(B, tokens)`` for a Wan2.2-latent transformer, and the latents with the condition as
    their first frame; that frame's tokens get timestep 0 (diffusers' ``expand_timesteps`` mask)."""
    batch, _, frames, height, width = hidden.shape
    per_frame = timestep.reshape(batch, 1).expand(batch, frames).clone()
    if first_frame_latents is not None:
        hidden = torch.cat([first_frame_latents.to(hidden), hidden[:, :, 1:]], dim=2)
        per_frame[:, 0] = 0
    tokens = (height // _PATCH_SIZE) * (width // _PATCH_SIZE)
    return hidden, per_frame.repeat_interleave(tokens, dim=1)
