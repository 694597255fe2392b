"""The keyword inputs the LTX-2 pipeline passes its denoiser, on the meta device, for the memory planner's dry run."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

# The planner's frame rate: the releases' 24 fps sets how many audio tokens a clip has.
FRAME_RATE = 24.0


def planner_inputs(model: nn.Module, height: int, width: int, frames: int, dtype: torch.dtype, batch: int,
                   prompt_tokens: int) -> dict[str, Any]:
    """The denoiser's inputs for a batch of ``batch`` clips of ``height`` x ``width`` x ``frames`` pixels, with their
    sound, and ``prompt_tokens``-token prompts."""
    config, meta = model.config, torch.device("meta")
    temporal, spatial = config.vae_scale_factors[0], config.vae_scale_factors[1]
    grid = ((frames - 1) // temporal + 1, height // spatial, width // spatial)
    # The audio VAE's latent frames: mel frames (one per hop) compressed 4x in time.
    audio_frames = max(1, round(frames / FRAME_RATE * config.audio_sampling_rate / config.audio_hop_length
                                / config.audio_scale_factor))
    sigma = torch.empty(batch, device=meta)
    # LTX-2's prompt tokens are Gemma-wide (the transformer projects them); LTX-2.3's connectors hand each stream
    # tokens of its cross-attention's width.
    if config.use_prompt_embeddings:
        video_prompt = audio_prompt = config.caption_channels
    else:
        video_prompt, audio_prompt = config.cross_attention_dim, config.audio_cross_attention_dim
    return dict(
        hidden_states=torch.empty(batch, grid[0] * grid[1] * grid[2], config.in_channels, dtype=dtype, device=meta),
        audio_hidden_states=torch.empty(batch, audio_frames, config.audio_in_channels, dtype=dtype, device=meta),
        encoder_hidden_states=torch.empty(batch, prompt_tokens, video_prompt, dtype=dtype, device=meta),
        audio_encoder_hidden_states=torch.empty(batch, prompt_tokens, audio_prompt, dtype=dtype, device=meta),
        timestep=sigma, audio_timestep=sigma, sigma=sigma, num_frames=grid[0], height=grid[1], width=grid[2],
        fps=FRAME_RATE, audio_num_frames=audio_frames, use_cross_timestep=bool(config.cross_attn_mod),
        return_dict=False,
    )  # fmt: skip
