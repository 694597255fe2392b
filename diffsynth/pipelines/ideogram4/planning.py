"""The keyword inputs the Ideogram 4 pipeline passes its denoiser, on the meta device, for the memory planner's dry
run."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def planner_inputs(model: nn.Module, height: int, width: int, frames: int, dtype: torch.dtype, batch: int,
                   prompt_tokens: int) -> dict[str, Any]:
    """The denoiser's inputs for a batch of ``batch`` samples of ``height`` x ``width`` (x ``frames``) pixels with
    ``prompt_tokens``-token prompts: one packed sequence of text and image tokens."""
    config, meta = model.config, torch.device("meta")
    tokens = prompt_tokens + (height // 16) * (width // 16)
    return dict(hidden_states=torch.empty(batch, tokens, config.in_channels, dtype=dtype, device=meta),
                timestep=torch.empty(batch, dtype=dtype, device=meta),
                encoder_hidden_states=torch.empty(batch, tokens, config.llm_features_dim, dtype=dtype, device=meta),
                position_ids=torch.zeros(batch, tokens, 3, dtype=torch.long, device=meta),
                segment_ids=torch.ones(batch, tokens, dtype=torch.long, device=meta),
                indicator=torch.ones(batch, tokens, dtype=torch.long, device=meta), return_dict=False)
