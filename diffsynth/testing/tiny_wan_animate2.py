"""Tiny random-weight ``Wan-AI/Wan2.2-Animate-2-14B`` in its release layout, the one the reference's scripts read.

- ``wan_animate_2/wan_animate_2_bf16.safetensors`` and ``..._bf16_distillation.safetensors``: a two-block
  ``WanAnimate2Transformer3DModel`` each (two seeds), one file each, under the release's names (``blocks.N.block.
  self_attn.q``, written by ``original.dit_to_original``), no ``config.json``. It is 256 wide with two heads: the
  loader takes the head count from Wan's head size of 128, as the release has it.
- ``videomodel/Wan-AI/``: the ``.pth`` T5 (with its tokenizer beside it in ``umt5-xxl/``, where the reference's
  inference example reads it) and CLIP files. The transformer's
  image projection reads 1280-wide CLIP features (fixed in diffusers' class), so this CLIP is 1280 wide, with one
  layer whose weights the penultimate hidden states never read.

The VAE is Wan2.1's, which the scripts load from ``Wan-AI/Wan2.1-T2V-14B`` (the tiny ``Wan2.1_VAE.pth``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..pipelines.wan_video.original import dit_to_original
from .tiny_common import prepare_repo, seeded
from .tiny_wan import TEXT_DIM, _save_pth, build_t5_tokenizer, tiny_umt5, umt5_original_state_dict, write_original_clip

WAN_ANIMATE2_MODEL_ID = "Wan-AI/Wan2.2-Animate-2-14B"
ANIMATE2_DIT_FILES = {"base": "wan_animate_2/wan_animate_2_bf16.safetensors",
                      "distilled": "wan_animate_2/wan_animate_2_bf16_distillation.safetensors"}
ANIMATE2_ENCODERS = {"text_encoder": "videomodel/Wan-AI/models_t5_umt5-xxl-enc-bf16.pth",
                     "image_encoder": "videomodel/Wan-AI/models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth"}
TINY_ANIMATE2_CLIP_SIZE = 16
_ANIMATE2, _CLIP = 40, 41  # seed offsets


def tiny_wan_animate2_transformer(seed: int) -> torch.nn.Module:
    """A two-block ``WanAnimate2Transformer3DModel``, 256 wide with two 128-wide heads."""
    from diffusers import WanAnimate2Transformer3DModel

    with seeded(seed + _ANIMATE2):
        return WanAnimate2Transformer3DModel(dim=256, ffn_dim=64, freq_dim=32, text_dim=TEXT_DIM, num_heads=2,
                                             num_layers=2)


def tiny_wide_clip_vision(seed: int) -> torch.nn.Module:
    """A 1280-wide, one-layer CLIP vision tower (16 heads, exact GELU) on 16-pixel images."""
    from transformers import CLIPVisionConfig, CLIPVisionModel

    with seeded(seed + _CLIP):
        return CLIPVisionModel(CLIPVisionConfig(
            hidden_size=1280, intermediate_size=16, num_hidden_layers=1, num_attention_heads=16,
            image_size=TINY_ANIMATE2_CLIP_SIZE, patch_size=8, projection_dim=32, hidden_act="gelu",
            layer_norm_eps=1e-5,
        ))  # fmt: skip


def build_tiny_wan_animate2(root: Path, model_id: str = WAN_ANIMATE2_MODEL_ID, seed: int = 0) -> Path:
    """Writes the release layout of ``Wan-AI/Wan2.2-Animate-2-14B`` at ``root/<model_id>``."""
    from safetensors.torch import save_file

    repo = prepare_repo(root, model_id)
    (repo / "videomodel" / "Wan-AI").mkdir(parents=True, exist_ok=True)
    tokenizer = build_t5_tokenizer()
    tokenizer.save_pretrained(repo / "videomodel" / "Wan-AI" / "umt5-xxl")
    text_encoder = umt5_original_state_dict(tiny_umt5(seed, tokenizer).state_dict())
    _save_pth(text_encoder, repo / ANIMATE2_ENCODERS["text_encoder"])
    write_original_clip(repo / ANIMATE2_ENCODERS["image_encoder"], tiny_wide_clip_vision(seed), seed)
    for offset, name in enumerate(ANIMATE2_DIT_FILES.values()):
        state = dit_to_original(tiny_wan_animate2_transformer(seed + offset).state_dict())
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        save_file({key: tensor.contiguous() for key, tensor in state.items()}, str(repo / name))
    return repo


WAN_ANIMATE2_BUILDERS = {"wan_animate2": build_tiny_wan_animate2}
