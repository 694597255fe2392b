"""The keyword inputs the ERNIE-Image pipeline passes its denoiser, on the meta device, for the memory planner's dry
run."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def planner_inputs(model: nn.Module, height: int, width: int, frames: int, dtype: torch.dtype, batch: int,
                   prompt_tokens: int) -> dict[str, Any]:
    """The denoiser's inputs for a batch of ``batch`` samples of ``height`` x ``width`` (x ``frames``) pixels with
    ``prompt_tokens``-token prompts."""
    config, meta = model.config, torch.device("meta")
    return dict(hidden_states=torch.empty(batch, config.in_channels, height // 16, width // 16, dtype=dtype,
                                          device=meta),
                timestep=torch.empty(batch, device=meta),
                text_bth=torch.empty(batch, prompt_tokens, config.text_in_dim, dtype=dtype, device=meta),
                text_lens=torch.full((batch,), prompt_tokens, dtype=torch.long, device=meta), return_dict=False)
