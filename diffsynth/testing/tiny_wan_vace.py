"""Tiny random-weight Wan VACE repos: diffusers' layout and the original release layouts the reference trains.

The transformer is a two-block ``WanVACETransformer3DModel`` with a VACE block after each main block; its main blocks
are ``tiny_wan.tiny_wan_transformer``'s sizes. The original layouts are written as the releases are (a ``config.json``
naming ``VaceWanModel`` with ``vace_layers`` and ``vace_in_dim``, original tensor names, ``.pth`` encoders and VAE,
the tokenizer in ``google/umt5-xxl/``); ``PAI/Wan2.2-VACE-Fun-A14B`` holds two experts in ``high_noise_model/`` and
``low_noise_model/``. Repository ids as the reference's scripts name them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..pipelines.wan_video.original import dit_original_config, dit_original_keys
from .tiny_common import SHARD_SIZE, model_index, prepare_repo, save_sharded_safetensors, seeded, write_json
from .tiny_wan import _WAN_COMPONENTS, TEXT_DIM, _write_diffusers_shared, _write_original_shared, tiny_wan_vae

WAN_VACE_MODEL_ID = "Wan-AI/Wan2.1-VACE-1.3B-diffusers"
WAN_VACE_ORIGINAL_MODEL_ID = "Wan-AI/Wan2.1-VACE-1.3B"
WAN_VACE_14B_MODEL_ID = "Wan-AI/Wan2.1-VACE-14B"
WAN_VACE_PREVIEW_MODEL_ID = "iic/VACE-Wan2.1-1.3B-Preview"
WAN22_VACE_FUN_MODEL_ID = "PAI/Wan2.2-VACE-Fun-A14B"
# Seeds of the transformers, as offsets from the builder's seed (beyond tiny_wan's).
_VACE, _HIGH, _LOW = 20, 21, 22


def tiny_wan_vace_transformer(seed: int, offset: int = _VACE) -> torch.nn.Module:
    """A two-block ``WanVACETransformer3DModel`` with VACE blocks at both layers (96 context channels)."""
    from diffusers import WanVACETransformer3DModel

    with seeded(seed + offset):
        return WanVACETransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=16, out_channels=16,
            text_dim=TEXT_DIM, freq_dim=32, ffn_dim=64, num_layers=2, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", vace_layers=[0, 1], vace_in_channels=96,
        )  # fmt: skip


def write_original_vace_dit(folder: Path, transformer: torch.nn.Module) -> None:
    """A VACE DiT as the releases ship it: ``config.json`` naming ``VaceWanModel`` and original-named shards."""
    state = transformer.state_dict()
    names = dit_original_keys(list(state))
    save_sharded_safetensors({names[key]: tensor for key, tensor in state.items()}, folder, "diffusion_pytorch_model")
    write_json(folder / "config.json", dit_original_config(transformer))


def build_tiny_wan_vace(root: Path, model_id: str = WAN_VACE_MODEL_ID, seed: int = 0) -> Path:
    """Writes a tiny ``Wan-AI/Wan2.1-VACE-1.3B-diffusers`` (the text-to-video layout with a VACE transformer)."""
    repo = prepare_repo(root, model_id)
    _write_diffusers_shared(repo, seed)
    tiny_wan_vace_transformer(seed).save_pretrained(repo / "transformer", max_shard_size=SHARD_SIZE)
    components = {**_WAN_COMPONENTS, "transformer": ("diffusers", "WanVACETransformer3DModel")}
    write_json(repo / "model_index.json", model_index("WanVACEPipeline", components))
    return repo


def build_tiny_wan_vace_original(root: Path, model_id: str = WAN_VACE_ORIGINAL_MODEL_ID, seed: int = 0) -> Path:
    """Writes the original layout of a Wan2.1 VACE release; the weights are ``build_tiny_wan_vace``'s."""
    repo = prepare_repo(root, model_id)
    _write_original_shared(repo, seed, tiny_wan_vae(seed), "Wan2.1_VAE.pth")
    write_original_vace_dit(repo, tiny_wan_vace_transformer(seed))
    return repo


def build_tiny_wan22_vace_fun(root: Path, model_id: str = WAN22_VACE_FUN_MODEL_ID, seed: int = 0) -> Path:
    """Writes the layout of ``PAI/Wan2.2-VACE-Fun-A14B``: two VACE experts beside the T5 encoder and Wan2.1 VAE."""
    repo = prepare_repo(root, model_id)
    _write_original_shared(repo, seed, tiny_wan_vae(seed), "Wan2.1_VAE.pth")
    write_original_vace_dit(repo / "high_noise_model", tiny_wan_vace_transformer(seed, _HIGH))
    write_original_vace_dit(repo / "low_noise_model", tiny_wan_vace_transformer(seed, _LOW))
    return repo


def _original(model_id: str):
    return lambda root, seed=0: build_tiny_wan_vace_original(root, model_id, seed)


WAN_VACE_BUILDERS = {
    "wan_vace": build_tiny_wan_vace, "wan_vace_original": build_tiny_wan_vace_original,
    "wan_vace_14b": _original(WAN_VACE_14B_MODEL_ID), "wan_vace_preview": _original(WAN_VACE_PREVIEW_MODEL_ID),
    "wan22_vace_fun": build_tiny_wan22_vace_fun,
}  # fmt: skip
