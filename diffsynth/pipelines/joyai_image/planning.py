"""The keyword inputs the JoyAI-Image-Edit pipeline passes its denoiser, on the meta device, for the memory planner's
dry run: an edit, the reference image's latents beside the target's."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

# The VAE's spatial compression.
_VAE_SCALE = 8


def planner_inputs(model: nn.Module, height: int, width: int, frames: int, dtype: torch.dtype, batch: int,
                   prompt_tokens: int) -> dict[str, Any]:
    """The denoiser's inputs for a batch of ``batch`` edits of ``height`` x ``width`` pixels with ``prompt_tokens``
    caption tokens (``frames`` is unused: images)."""
    config, meta = model.config, torch.device("meta")
    items = (batch, 2, config.in_channels, 1, height // _VAE_SCALE, width // _VAE_SCALE)
    return dict(hidden_states=torch.empty(items, dtype=dtype, device=meta), timestep=torch.empty(batch, device=meta),
                encoder_hidden_states=torch.empty(batch, prompt_tokens, config.text_dim, dtype=dtype, device=meta),
                return_dict=False)
