"""The tiny LTX-2 in the reference's repackaged layout (``DiffSynth-Studio/LTX-2-Repackage``): LTX-2's own key names,
one file per component, written from the same seeded models as the diffusers-layout tiny repo (``tiny_ltx2``).

- ``transformer.safetensors``: the transformer under ``model.diffusion_model.`` and LTX-2's layer names;
- ``text_encoder_post_modules.safetensors``: the Gemma feature projection and both text connectors;

and the Gemma-3 text encoder as Google releases it (``google/gemma-3-12b-it-qat-q4_0-unquantized``): ``config.json``,
``model-0000i-of-0000n.safetensors`` shards under the names of transformers 4 (``language_model.model.*``,
``vision_tower.*``, ``multi_modal_projector.*``, no ``lm_head``: it is tied to the embeddings) and the tokenizer's
files at the repository's root, not in a ``tokenizer/`` folder.

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
from .tiny_common import prepare_repo, save_sharded_safetensors, seeded
from .tiny_ltx2 import _SEEDS, _connectors, _gemma, _transformer, build_gemma_tokenizer

LTX2_REPACKAGE_MODEL_ID = "DiffSynth-Studio/LTX-2-Repackage"
GEMMA_MODEL_ID = "google/gemma-3-12b-it-qat-q4_0-unquantized"
GEMMA_PATTERN = "model-*.safetensors"
# transformers 5's names -> the release's (transformers 4's), by prefix.
_GEMMA_RELEASE_PREFIXES = {"model.language_model.": "language_model.model.", "model.vision_tower.": "vision_tower.",
                           "model.multi_modal_projector.": "multi_modal_projector."}
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


def _released_gemma_key(key: str) -> str:
    for new, old in _GEMMA_RELEASE_PREFIXES.items():
        if key.startswith(new):
            return old + key.removeprefix(new)
    raise ValueError(f"Gemma-3 key {key!r} has no counterpart in the released layout")


def build_tiny_gemma_release(root: Path, model_id: str = GEMMA_MODEL_ID, seed: int = 0) -> Path:
    """Writes the tiny LTX-2 text encoder (same seed as ``tiny_ltx2``'s) in Gemma-3's released layout at
    ``root/<model_id>``."""
    repo = prepare_repo(root, model_id)
    tokenizer = build_gemma_tokenizer()
    tokenizer.save_pretrained(repo)
    with seeded(seed + _SEEDS["text_encoder"]):
        gemma = _gemma(tokenizer)
    gemma.config.architectures = [type(gemma).__name__]  # as the release's config.json names it
    gemma.config.save_pretrained(repo)
    state_dict = {_released_gemma_key(key): tensor for key, tensor in gemma.state_dict().items()
                  if key != "lm_head.weight"}
    save_sharded_safetensors(state_dict, repo, "model")
    return repo


LTX2_REPACKAGE_BUILDERS = {"ltx2_repackage": build_tiny_ltx2_repackage, "gemma3_release": build_tiny_gemma_release}
