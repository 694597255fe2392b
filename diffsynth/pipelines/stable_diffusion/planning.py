"""The keyword inputs the Stable Diffusion pipelines pass their UNet, on the meta device, for the memory planner's dry
run (SDXL's also the pooled embedding and the time ids)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def planner_inputs(model: nn.Module, height: int, width: int, frames: int, dtype: torch.dtype, batch: int,
                   prompt_tokens: int) -> dict[str, Any]:
    """The UNet's inputs for a batch of ``batch`` samples of ``height`` x ``width`` pixels with ``prompt_tokens``
    prompt tokens (CLIP pads every prompt to 77)."""
    config, meta = model.config, torch.device("meta")
    inputs = dict(sample=torch.empty(batch, config.in_channels, height // 8, width // 8, dtype=dtype, device=meta),
                  timestep=torch.empty(batch, device=meta),
                  encoder_hidden_states=torch.empty(batch, prompt_tokens, config.cross_attention_dim, dtype=dtype,
                                                    device=meta),
                  return_dict=False)
    if config.addition_embed_type == "text_time":
        pooled = config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim
        inputs["added_cond_kwargs"] = {"text_embeds": torch.empty(batch, pooled, dtype=dtype, device=meta),
                                       "time_ids": torch.empty(batch, 6, dtype=dtype, device=meta)}
    return inputs
