"""Tiny random-weight Wan2.2-Animate repos: the release's original layout the reference trains, and diffusers'.

The transformer is a two-block ``WanAnimateTransformer3DModel`` (``tiny_wan``'s block sizes, CLIP cross-attention) with
a face adapter after each block and a motion encoder on 8x8 face crops (one residual block). The original layout is
the release's: ``config.json`` and original-named ``diffusion_pytorch_model*.safetensors`` shards (written by
``original.dit_to_original``: fused face-adapter K/V, ``(1, C, 1, 1)`` biases, blur kernels), the ``.pth`` T5, VAE
and CLIP files and ``google/umt5-xxl/``. Both repos hold the same weights.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..pipelines.wan_video.original import dit_original_config, dit_to_original
from .tiny_common import SHARD_SIZE, model_index, prepare_repo, save_sharded_safetensors, seeded, write_json
from .tiny_wan import (
    _WAN_COMPONENTS,
    TEXT_DIM,
    WAN_I2V_IMAGE_PROCESSOR_CONFIG,
    WAN_I2V_ORIGINAL_PATTERNS,
    _write_diffusers_shared,
    _write_original_shared,
    tiny_clip_vision,
    tiny_wan_vae,
    write_original_clip,
)

WAN_ANIMATE_MODEL_ID = "Wan-AI/Wan2.2-Animate-14B"
WAN_ANIMATE_DIFFUSERS_MODEL_ID = "Wan-AI/Wan2.2-Animate-14B-Diffusers"
# The face crops the tiny motion encoder reads (the release's is 512).
TINY_FACE_SIZE = 8
_ANIMATE = 30  # seed offset of the transformer


def tiny_wan_animate_transformer(seed: int) -> torch.nn.Module:
    """A two-block ``WanAnimateTransformer3DModel`` with a face adapter after each block."""
    from diffusers import WanAnimateTransformer3DModel

    with seeded(seed + _ANIMATE):
        return WanAnimateTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=36, latent_channels=16,
            out_channels=16, text_dim=TEXT_DIM, freq_dim=32, ffn_dim=64, num_layers=2, image_dim=32,
            added_kv_proj_dim=32, motion_encoder_channel_sizes={"8": 8, "4": 8},
            motion_encoder_size=TINY_FACE_SIZE, motion_style_dim=16, motion_dim=4, motion_encoder_dim=16,
            face_encoder_hidden_dim=16, face_encoder_num_heads=2, inject_face_latents_blocks=1,
        )  # fmt: skip


def build_tiny_wan_animate(root: Path, model_id: str = WAN_ANIMATE_MODEL_ID, seed: int = 0) -> Path:
    """Writes the original layout of ``Wan-AI/Wan2.2-Animate-14B`` at ``root/<model_id>``."""
    repo = prepare_repo(root, model_id)
    _write_original_shared(repo, seed, tiny_wan_vae(seed), "Wan2.1_VAE.pth")
    write_original_clip(repo / WAN_I2V_ORIGINAL_PATTERNS["image_encoder"], tiny_clip_vision(seed), seed)
    transformer = tiny_wan_animate_transformer(seed)
    save_sharded_safetensors(dit_to_original(transformer.state_dict()), repo, "diffusion_pytorch_model")
    write_json(repo / "config.json", dit_original_config(transformer))
    return repo


def build_tiny_wan_animate_diffusers(root: Path, model_id: str = WAN_ANIMATE_DIFFUSERS_MODEL_ID,
                                     seed: int = 0) -> Path:
    """Writes diffusers' layout of Wan2.2-Animate (``WanAnimatePipeline``'s folders) at ``root/<model_id>``."""
    repo = prepare_repo(root, model_id)
    _write_diffusers_shared(repo, seed)
    tiny_clip_vision(seed).save_pretrained(repo / "image_encoder")
    write_json(repo / "image_processor" / "preprocessor_config.json", WAN_I2V_IMAGE_PROCESSOR_CONFIG)
    tiny_wan_animate_transformer(seed).save_pretrained(repo / "transformer", max_shard_size=SHARD_SIZE)
    components = {**_WAN_COMPONENTS, "transformer": ("diffusers", "WanAnimateTransformer3DModel"),
                  "image_encoder": ("transformers", "CLIPVisionModel"),
                  "image_processor": ("transformers", "CLIPImageProcessor")}  # fmt: skip
    write_json(repo / "model_index.json", model_index("WanAnimatePipeline", components))
    return repo


WAN_ANIMATE_BUILDERS = {"wan_animate": build_tiny_wan_animate,
                        "wan_animate_diffusers": build_tiny_wan_animate_diffusers}
