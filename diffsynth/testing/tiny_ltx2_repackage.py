"""The tiny LTX-2 in the reference's repackaged layout (``DiffSynth-Studio/LTX-2-Repackage``): LTX-2's own key names,
one file per component, written from the same seeded models as the diffusers-layout tiny repo (``tiny_ltx2``).

- ``transformer.safetensors``: the transformer under ``model.diffusion_model.`` and LTX-2's layer names;
- ``text_encoder_post_modules.safetensors``: the Gemma feature projection and both text connectors.

Each file carries, as Lightricks' release does, a ``config`` JSON in its safetensors metadata with the head counts
and rotary settings the tensors do not record (a ``transformer`` section under LTX-2's names). The keys are the
inverse of ``pipelines.ltx2.original``'s map, applied to every tensor of the diffusers models, so that loading these
files back is tested against the diffusers ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..core.files import atomic_save_safetensors
from ..pipelines.ltx2.original import connectors_key_to_original, transformer_key_to_original
from .tiny_common import prepare_repo, seeded
from .tiny_ltx2 import _SEEDS, _connectors, _transformer

LTX2_REPACKAGE_MODEL_ID = "DiffSynth-Studio/LTX-2-Repackage"
LTX2_REPACKAGE_PATTERNS = {
    "dit": "transformer.safetensors",
    "connectors": "text_encoder_post_modules.safetensors",
}


def official_metadata(transformer: torch.nn.Module, connectors: torch.nn.Module) -> dict[str, str]:
    """The ``config`` metadata entry of LTX-2's files (its ``transformer`` section) for these models."""
    dit, text = transformer.config, connectors.config
    section = {
        "num_attention_heads": dit.num_attention_heads, "attention_head_dim": dit.attention_head_dim,
        "audio_num_attention_heads": dit.audio_num_attention_heads,
        "audio_attention_head_dim": dit.audio_attention_head_dim, "rope_type": dit.rope_type,
        "frequencies_precision": "float64" if dit.rope_double_precision else "float32",
        "positional_embedding_theta": dit.rope_theta,
        "positional_embedding_max_pos": [dit.pos_embed_max_pos, dit.base_height, dit.base_width],
        "timestep_scale_multiplier": dit.timestep_scale_multiplier,
        "av_ca_timestep_scale_multiplier": dit.cross_attn_timestep_scale_multiplier,
        "connector_num_attention_heads": text.video_connector_num_attention_heads,
        "connector_attention_head_dim": text.video_connector_attention_head_dim,
        "audio_connector_num_attention_heads": text.audio_connector_num_attention_heads,
        "audio_connector_attention_head_dim": text.audio_connector_attention_head_dim,
        "connector_positional_embedding_max_pos": [text.connector_rope_base_seq_len],
    }  # fmt: skip
    return {"config": json.dumps({"transformer": section})}


def _original(model: torch.nn.Module, rename) -> dict[str, torch.Tensor]:
    return {rename(key): tensor.contiguous() for key, tensor in model.state_dict().items()}


def build_tiny_ltx2_repackage(root: Path, model_id: str = LTX2_REPACKAGE_MODEL_ID, seed: int = 0) -> Path:
    """Writes the tiny repackaged LTX-2 at ``root/<model_id>``: the tiny ``Lightricks/LTX-2`` transformer and text
    connectors (same seeds) under LTX-2's key names."""
    repo = prepare_repo(root, model_id)
    with seeded(seed + _SEEDS["transformer"]):
        transformer = _transformer()
    with seeded(seed + _SEEDS["connectors"]):
        connectors = _connectors()
    metadata = official_metadata(transformer, connectors)
    atomic_save_safetensors(_original(transformer, transformer_key_to_original), repo / "transformer.safetensors",
                            metadata=metadata)
    atomic_save_safetensors(_original(connectors, connectors_key_to_original),
                            repo / "text_encoder_post_modules.safetensors", metadata=metadata)
    return repo


LTX2_REPACKAGE_BUILDERS = {"ltx2_repackage": build_tiny_ltx2_repackage}
