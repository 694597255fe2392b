"""The keyword inputs the Z-Image pipeline passes its denoiser, on the meta device, for the memory planner's dry run."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def planner_inputs(model: nn.Module, height: int, width: int, frames: int, dtype: torch.dtype, batch: int,
                   prompt_tokens: int) -> dict[str, Any]:
    """The denoiser's inputs for a batch of ``batch`` samples of ``height`` x ``width`` (x ``frames``) pixels with
    ``prompt_tokens``-token prompts."""
    config, meta, text = model.config, torch.device("meta"), prompt_tokens
    # One tensor per sample: (channels, frames, rows, cols) latents.
    latents = torch.empty(config.in_channels, 1, height // 8, width // 8, dtype=dtype, device=meta)
    return dict(x=[latents] * batch, t=torch.empty(batch, device=meta),
                cap_feats=[torch.empty(text, config.cap_feat_dim, dtype=dtype, device=meta)] * batch,
                return_dict=False)
