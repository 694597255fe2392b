"""The keyword inputs the Krea 2 pipeline passes its denoiser, on the meta device, for the memory planner's dry run."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def planner_inputs(model: nn.Module, height: int, width: int, frames: int, dtype: torch.dtype, batch: int,
                   prompt_tokens: int) -> dict[str, Any]:
    """The denoiser's inputs for a batch of ``batch`` samples of ``height`` x ``width`` (x ``frames``) pixels with
    ``prompt_tokens``-token prompts."""
    config, meta, text = model.config, torch.device("meta"), prompt_tokens
    tokens = (height // 16) * (width // 16)
    return dict(hidden_states=torch.empty(batch, tokens, config.in_channels, dtype=dtype, device=meta),
                encoder_hidden_states=torch.empty(batch, text, config.num_text_layers, config.text_hidden_dim,
                                                  dtype=dtype, device=meta),
                timestep=torch.empty(batch, device=meta), position_ids=torch.zeros(text + tokens, 3, device=meta),
                encoder_attention_mask=torch.ones(batch, text, dtype=torch.bool, device=meta), return_dict=False)
