"""Wan2.2-Animate-2's in-context self-attention with the block mask applied densely, for devices other than CUDA.

diffusers' ``WanAnimate2AttnProcessor`` runs the generation pass (``kv_cache_mode="cached"``) through a flex-attention
``BlockMask``: each generation token attends to every generation token, and a token of latent frame ``i >= 1`` also to
the reference tokens of the reference video's latent frame ``i - 1`` (frame 0, the character image, sees no reference
token). PyTorch's flex attention has no backward on the CPU ("does not support backward on CPU"), and building the
mask compiles it (seconds on a CPU). ``DenseAnimate2AttnProcessor`` computes the same attention with
``scaled_dot_product_attention`` and a boolean ``(queries, keys)`` mask: exact, and trainable anywhere, at the cost
of a score matrix over all tokens (fine for the small clips tests and CPUs run; CUDA keeps the flex kernel).

The two agree when the segment is the whole video, which is how this pipeline calls the transformer: then diffusers'
packing into the full video's 128-aligned buffer only adds masked padding.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from diffusers.models.transformers.transformer_wan_animate_2 import (
    WanAnimate2AttnProcessor,
    _get_qkv_projections,
    rope_apply,
)


def incontext_mask(grid: torch.Tensor, reference_grid: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``(f*h*w, f*h*w + rf*rh*rw)`` booleans, True where a generation token (``grid`` = ``(f, h, w)``) attends: every
    generation token, and the reference tokens (``reference_grid``) of the previous latent frame's index. Built once
    per shape: every block of every step reads the same mask (it is never written to)."""
    return _incontext_mask(tuple(grid.tolist()), tuple(reference_grid.tolist()), device)


@functools.lru_cache(maxsize=4)
def _incontext_mask(grid: tuple[int, int, int], reference_grid: tuple[int, int, int],
                    device: torch.device) -> torch.Tensor:
    frames, height, width = grid
    ref_frames, ref_height, ref_width = reference_grid
    query_frame = torch.arange(frames * height * width, device=device) // (height * width)
    reference_frame = torch.arange(ref_frames * ref_height * ref_width, device=device) // (ref_height * ref_width) + 1
    generation = torch.ones(len(query_frame), len(query_frame), dtype=torch.bool, device=device)
    return torch.cat([generation, query_frame[:, None] == reference_frame[None, :]], dim=1)


class DenseAnimate2AttnProcessor(WanAnimate2AttnProcessor):
    """``WanAnimate2AttnProcessor`` with the generation pass's block mask as a dense boolean mask (module docstring);
    the reference pass (``"extract"``) is diffusers' own."""

    def __call__(self, attn: Any, hidden_states: torch.Tensor, rotary_emb: torch.Tensor, grid_sizes: torch.Tensor,
                 kv_cache: Any, kv_cache_mode: str, rope_stride: int = 1,
                 reference_rotary_emb: torch.Tensor | None = None, reference_grid_sizes: torch.Tensor | None = None,
                 reference_rope_stride: int = 1, **_: Any) -> torch.Tensor:
        if kv_cache_mode != "cached":
            return super().__call__(attn, hidden_states, rotary_emb, grid_sizes, kv_cache, kv_cache_mode, rope_stride)
        query, key, value = _get_qkv_projections(attn, hidden_states, None)
        query, key = attn.norm_q(query), attn.norm_k(key)
        query, key, value = (tensor.unflatten(2, (attn.heads, -1)) for tensor in (query, key, value))
        query = rope_apply(query, grid_sizes, rotary_emb, rope_stride).type_as(value)
        key = rope_apply(key, grid_sizes, rotary_emb, rope_stride).type_as(value)
        key_ref, value_ref = kv_cache.get()
        key_ref = rope_apply(key_ref, reference_grid_sizes, reference_rotary_emb, reference_rope_stride).type_as(value)
        mask = incontext_mask(grid_sizes[0], reference_grid_sizes[0], hidden_states.device)
        valid, references = mask.shape[0], mask.shape[1] - mask.shape[0]
        keys = torch.cat([key[:, :valid], key_ref[:, :references]], dim=1)
        values = torch.cat([value[:, :valid], value_ref[:, :references].to(value)], dim=1)
        out = torch.nn.functional.scaled_dot_product_attention(
            query[:, :valid].transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), attn_mask=mask)
        # Tokens past the grid (none in this pipeline's calls) pass through, as in diffusers' processor.
        out = torch.cat([out.transpose(1, 2), query[:, valid:]], dim=1).flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))


def use_attention_for(dit: torch.nn.Module, device: torch.device, mask_id: tuple[int, int]) -> None:
    """Gives every block of ``dit`` the dense processor off CUDA and diffusers' flex one on CUDA.

    The dense processor builds its own mask, so the entry ``mask_id`` of ``dit.block_masks`` is marked present (None):
    diffusers would otherwise compile a ``BlockMask`` it never reads; on CUDA such a mark is removed again.
    """
    dense = device.type != "cuda"
    for block in dit.blocks:
        if dense != isinstance(block.self_attn.processor, DenseAnimate2AttnProcessor):
            block.self_attn.set_processor(DenseAnimate2AttnProcessor() if dense else WanAnimate2AttnProcessor())
    if dense:
        dit.block_masks.setdefault(mask_id, None)
    elif mask_id in dit.block_masks and dit.block_masks[mask_id] is None:
        del dit.block_masks[mask_id]
