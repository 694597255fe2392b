"""Tiny random-weight repos of the PAI Wan Fun Control and Control-Camera releases, in their released layout.

The PAI repos ship the original Wan layout (``config.json`` naming ``WanModel`` beside original-named shards, the
``.pth`` encoders, ``google/umt5-xxl/``), their DiT wider than Wan2.1's (control latents, image condition) and, for
Fun-V1.1 Control and Wan2.2-Fun-A14B-Control, ``ref_conv.*``, for the Control-Camera models ``control_adapter.*``
(the reference's ``model_configs.py``: ``in_dim``, ``has_ref_conv``, ``add_control_adapter``). The Wan2.2 ones hold
two experts in ``high_noise_model/`` and ``low_noise_model/`` and no CLIP encoder. The 14B releases differ from the
1.3B ones in sizes only: tests alias them to these.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch

from .tiny_common import prepare_repo, seeded
from .tiny_wan import (
    TEXT_DIM,
    WAN_I2V_ORIGINAL_PATTERNS,
    _write_original_shared,
    tiny_clip_vision,
    tiny_wan_transformer,
    tiny_wan_vae,
    write_original_clip,
    write_original_dit,
)

# Seed offsets of the Fun transformers (the other components share tiny_wan's seeds).
_FUN_DIT, _FUN_LOW = 20, 21


class FunRelease(NamedTuple):
    """What a Fun release's DiT has: input channels, CLIP cross-attention, ``ref_conv``, camera adapter, experts."""

    in_channels: int
    clip: bool
    reference_conv: bool
    camera: bool
    experts: bool


FUN_RELEASES = {
    "PAI/Wan2.1-Fun-1.3B-Control": FunRelease(48, True, False, False, False),
    "PAI/Wan2.1-Fun-V1.1-1.3B-Control": FunRelease(48, True, True, False, False),
    "PAI/Wan2.1-Fun-V1.1-1.3B-Control-Camera": FunRelease(32, True, False, True, False),
    "PAI/Wan2.2-Fun-A14B-Control": FunRelease(52, False, True, False, True),
    "PAI/Wan2.2-Fun-A14B-Control-Camera": FunRelease(36, False, False, True, True),
}
# The 14B releases, by the tiny repo of the same structure.
FUN_ALIASES = {
    "PAI/Wan2.1-Fun-14B-Control": "PAI/Wan2.1-Fun-1.3B-Control",
    "PAI/Wan2.1-Fun-V1.1-14B-Control": "PAI/Wan2.1-Fun-V1.1-1.3B-Control",
    "PAI/Wan2.1-Fun-V1.1-14B-Control-Camera": "PAI/Wan2.1-Fun-V1.1-1.3B-Control-Camera",
}
# Channels of the camera adapter's input: 6 Plücker coordinates x 4 frames per latent frame.
CAMERA_CHANNELS = 24


def tiny_fun_transformer(release: FunRelease, seed: int, offset: int = _FUN_DIT,
                         clip_dim: int = 32) -> torch.nn.Module:
    """A two-block transformer of ``release``'s structure: ``WanFunTransformer3DModel`` where it has ``ref_conv`` or
    a camera adapter, else diffusers' ``WanTransformer3DModel`` (Fun 1.0 Control); ``clip_dim`` is the width of the
    CLIP features it reads, where it reads them (ComfyUI's Wan code takes the releases' 1280 only)."""
    image_dim = clip_dim if release.clip else None
    if not (release.reference_conv or release.camera):
        return tiny_wan_transformer(seed, offset, in_channels=release.in_channels, image_dim=image_dim)
    from ..pipelines.wan_video.fun_model import WanFunTransformer3DModel

    with seeded(seed + offset):
        return WanFunTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=release.in_channels,
            out_channels=16, text_dim=TEXT_DIM, freq_dim=32, ffn_dim=64, num_layers=2, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", image_dim=image_dim, added_kv_proj_dim=32 if release.clip else None,
            reference_conv=release.reference_conv, camera_channels=CAMERA_CHANNELS if release.camera else None,
        )  # fmt: skip


def build_tiny_wan_fun(root: Path, model_id: str, seed: int = 0) -> Path:
    """Writes the released layout of one of ``FUN_RELEASES`` at ``root/<model_id>``."""
    release = FUN_RELEASES[model_id]
    repo = prepare_repo(root, model_id)
    _write_original_shared(repo, seed, tiny_wan_vae(seed), "Wan2.1_VAE.pth")
    if release.clip:
        write_original_clip(repo / WAN_I2V_ORIGINAL_PATTERNS["image_encoder"], tiny_clip_vision(seed), seed)
    if release.experts:
        write_original_dit(repo / "high_noise_model", tiny_fun_transformer(release, seed), "i2v")
        write_original_dit(repo / "low_noise_model", tiny_fun_transformer(release, seed, _FUN_LOW), "i2v")
    else:
        write_original_dit(repo, tiny_fun_transformer(release, seed), "i2v")
    return repo


def build_tiny_wan_fun_repos(root: Path, seed: int = 0) -> Path:
    """Writes every ``FUN_RELEASES`` repo under ``root`` and links the ``FUN_ALIASES`` to them."""
    for model_id in FUN_RELEASES:
        build_tiny_wan_fun(root, model_id, seed)
    for alias, model_id in FUN_ALIASES.items():
        (root / alias).symlink_to(root / model_id, target_is_directory=True)
    return root
