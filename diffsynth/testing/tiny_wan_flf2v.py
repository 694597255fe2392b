"""A tiny random-weight ``Wan-AI/Wan2.1-FLF2V-14B-720P`` in its original release layout.

The release is a Wan2.1 image-to-video repository (a ``WanModel`` DiT with 36 input channels and image
cross-attention, the T5, VAE and CLIP ``.pth`` files, ``google/umt5-xxl/``) whose DiT has ``model_type`` ``flf2v``
and ``img_emb.emb_pos``: learned positions for the CLIP tokens of two images, the first and the last frame. Those
positions start at zero in diffusers' class; here they are random, so a mix-up of the two images' tokens shows.

The Fun InP releases (``PAI/Wan2.1-Fun-*-InP``, ``PAI/Wan2.2-Fun-A14B-InP``) need no builder of their own: their files
are laid out, named and shaped as ``Wan-AI/Wan2.1-I2V-14B-480P``'s and ``Wan-AI/Wan2.2-I2V-A14B``'s (the reference
reads them with the same configs), so tests link those tiny repos under the Fun ids.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .tiny_common import prepare_repo, seeded
from .tiny_wan import (
    TINY_CLIP_IMAGE_SIZE,
    WAN_I2V_ORIGINAL_PATTERNS,
    _write_original_shared,
    tiny_clip_vision,
    tiny_wan_transformer,
    tiny_wan_vae,
    write_original_clip,
    write_original_dit,
)

WAN_FLF2V_MODEL_ID = "Wan-AI/Wan2.1-FLF2V-14B-720P"
WAN_FLF2V_PATTERNS = WAN_I2V_ORIGINAL_PATTERNS
# CLIP tokens of one tiny image: its 8-pixel patches plus the class token.
_CLIP_TOKENS = (TINY_CLIP_IMAGE_SIZE // 8) ** 2 + 1
# Seed offset of the FLF2V DiT, past tiny_wan.py's components.
_FLF2V = 20


def tiny_flf2v_transformer(seed: int, clip_dim: int = 32) -> torch.nn.Module:
    """The image-to-video ``WanTransformer3DModel`` with positions for two images' CLIP tokens, set at random;
    ``clip_dim`` is the width of the CLIP features (ComfyUI's Wan code takes the release's 1280 only)."""
    transformer = tiny_wan_transformer(seed, _FLF2V, in_channels=36, image_dim=clip_dim,
                                       pos_embed_seq_len=2 * _CLIP_TOKENS)
    with seeded(seed + _FLF2V), torch.no_grad():
        transformer.condition_embedder.image_embedder.pos_embed.normal_()
    return transformer


def build_tiny_wan_flf2v_original(root: Path, model_id: str = WAN_FLF2V_MODEL_ID, seed: int = 0) -> Path:
    """Writes the original layout of ``Wan-AI/Wan2.1-FLF2V-14B-720P`` at ``root/<model_id>``."""
    repo = prepare_repo(root, model_id)
    _write_original_shared(repo, seed, tiny_wan_vae(seed), "Wan2.1_VAE.pth")
    write_original_clip(repo / WAN_FLF2V_PATTERNS["image_encoder"], tiny_clip_vision(seed), seed)
    write_original_dit(repo, tiny_flf2v_transformer(seed), "flf2v")
    return repo


WAN_FLF2V_BUILDERS = {"wan_flf2v_original": build_tiny_wan_flf2v_original}
