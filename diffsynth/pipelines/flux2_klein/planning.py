"""The keyword inputs the FLUX.2 pipeline passes its denoiser, on the meta device, for the memory planner's dry run."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def planner_inputs(model: nn.Module, height: int, width: int, frames: int, dtype: torch.dtype, batch: int,
                   prompt_tokens: int) -> dict[str, Any]:
    """The denoiser's inputs for a batch of ``batch`` samples of ``height`` x ``width`` (x ``frames``) pixels with
    ``prompt_tokens``-token prompts; the guidance scale too for dev's guidance-distilled transformer."""
    config, meta, text = model.config, torch.device("meta"), prompt_tokens
    tokens = (height // 16) * (width // 16)
    guidance = torch.empty(batch, device=meta) if config.guidance_embeds else None
    return dict(hidden_states=torch.empty(batch, tokens, config.in_channels, dtype=dtype, device=meta),
                encoder_hidden_states=torch.empty(batch, text, config.joint_attention_dim, dtype=dtype, device=meta),
                timestep=torch.empty(batch, device=meta), guidance=guidance,
                img_ids=torch.zeros(batch, tokens, 4, device=meta), txt_ids=torch.zeros(batch, text, 4, device=meta),
                return_dict=False)
