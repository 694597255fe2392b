"""The keyword inputs the Qwen-Image pipeline passes its denoiser, on the meta device, for the memory planner's dry run."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def planner_inputs(model: nn.Module, height: int, width: int, frames: int, dtype: torch.dtype, batch: int,
                   prompt_tokens: int) -> dict[str, Any]:
    """The denoiser's inputs for a batch of ``batch`` samples of ``height`` x ``width`` (x ``frames``) pixels with
    ``prompt_tokens``-token prompts."""
    config, meta, text = model.config, torch.device("meta"), prompt_tokens
    rows, cols = height // 16, width // 16
    return dict(hidden_states=torch.empty(batch, rows * cols, config.in_channels, dtype=dtype, device=meta),
                encoder_hidden_states=torch.empty(batch, text, config.joint_attention_dim, dtype=dtype, device=meta),
                encoder_hidden_states_mask=torch.ones(batch, text, device=meta),
                timestep=torch.empty(batch, device=meta), img_shapes=[[(1, rows, cols)]] * batch, return_dict=False)
