"""The tiny LTX-2 in the reference's repackaged layout (``DiffSynth-Studio/LTX-2-Repackage``): LTX-2's own key names,
one file per component, written from the same seeded models as the diffusers-layout tiny repo (``tiny_ltx2``).

- ``transformer.safetensors``: the transformer under ``model.diffusion_model.`` and LTX-2's layer names;
- ``text_encoder_post_modules.safetensors``: the Gemma feature projection and both text connectors;
- ``video_vae_encoder`` / ``video_vae_decoder``, ``audio_vae_encoder`` / ``audio_vae_decoder``: each half of a VAE
  with the latent statistics (the video VAE's with the release's unused ``channel`` and ``mean-of-stds`` too), as
  the reference's splitter cuts them; ``audio_vocoder.safetensors``: the vocoder;

and the Gemma-3 text encoder as Google releases it (``google/gemma-3-12b-it-qat-q4_0-unquantized``): ``config.json``,
``model-0000i-of-0000n.safetensors`` shards under the names of transformers 4 (``language_model.model.*``,
``vision_tower.*``, ``multi_modal_projector.*``, no ``lm_head``: it is tied to the embeddings) and the tokenizer's
files at the repository's root, not in a ``tokenizer/`` folder.

Each file carries, as Lightricks' release does, a ``config`` JSON in its safetensors metadata with the settings the
tensors do not record, under LTX-2's names: head counts and rotary settings (``transformer``), the mel bins and
rates of the audio VAE (``audio_vae``) and the vocoder's strides and rate (``vocoder``), which differ from the
release's in the tiny models. The keys are the
inverse of ``pipelines.ltx2.original``'s map, applied to every tensor of the diffusers models, so that loading these
files back is tested against the diffusers ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..core.files import atomic_save_safetensors
from ..pipelines.ltx2.original import connectors_key_to_original, transformer_key_to_original
from ..pipelines.ltx2.original_audio import audio_vae_key_to_original, vocoder_key_to_original
from ..pipelines.ltx2.original_vae import video_vae_key_namer
from .tiny_common import prepare_repo, save_sharded_safetensors, seeded
from .tiny_ltx2 import (
    _SEEDS,
    _audio_vae,
    _connectors,
    _gemma,
    _transformer,
    _video_vae,
    _vocoder,
    build_gemma_tokenizer,
)

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
# The VAE halves and the vocoder, by the slot part they fill.
LTX2_REPACKAGE_PARTS = {
    "vae_encoder": "video_vae_encoder.safetensors",
    "vae_decoder": "video_vae_decoder.safetensors",
    "audio_vae_encoder": "audio_vae_encoder.safetensors",
    "audio_vae_decoder": "audio_vae_decoder.safetensors",
    "vocoder": "audio_vocoder.safetensors",
}


def official_metadata(transformer: torch.nn.Module, connectors: torch.nn.Module,
                      audio_vae: torch.nn.Module | None = None,
                      vocoder: torch.nn.Module | None = None) -> dict[str, str]:
    """The ``config`` metadata entry of LTX-2's files (its ``transformer`` section, and given both audio models its
    ``audio_vae`` and ``vocoder`` sections) for these models."""
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
    audio = _audio_sections(audio_vae, vocoder) if audio_vae is not None and vocoder is not None else {}
    return {"config": json.dumps({"transformer": section, **audio})}


def _audio_sections(audio_vae: torch.nn.Module, vocoder: torch.nn.Module) -> dict:
    """The ``audio_vae`` and ``vocoder`` sections of LTX-2's ``config`` metadata for these models."""
    voc = vocoder.config
    return {
        "audio_vae": audio_vae_section(audio_vae),
        "vocoder": {"upsample_rates": list(voc.upsample_factors),
                    "upsample_kernel_sizes": list(voc.upsample_kernel_sizes),
                    "resblock_kernel_sizes": list(voc.resnet_kernel_sizes),
                    "resblock_dilation_sizes": [list(d) for d in voc.resnet_dilations],
                    "upsample_initial_channel": voc.hidden_channels, "output_sample_rate": voc.output_sampling_rate},
    }  # fmt: skip


def audio_vae_section(audio_vae: torch.nn.Module) -> dict:
    """The ``audio_vae`` section of LTX-2's ``config`` metadata for this diffusers audio VAE."""
    audio = audio_vae.config
    return {"model": {"params": {"sampling_rate": audio.sample_rate, "ddconfig": {
                "mel_bins": audio.mel_bins, "resolution": audio.resolution, "ch": audio.base_channels,
                "ch_mult": list(audio.ch_mult), "z_channels": audio.latent_channels}}},
            "preprocessing": {"stft": {"hop_length": audio.mel_hop_length, "causal": audio.is_causal}}}


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
    with seeded(seed + _SEEDS["vae"]):
        vae = _video_vae()
    with seeded(seed + _SEEDS["audio_vae"]):
        audio_vae = _audio_vae()
    with seeded(seed + _SEEDS["vocoder"]):
        vocoder = _vocoder()
    metadata = official_metadata(transformer, connectors, audio_vae, vocoder)
    files = {
        "transformer": _original(transformer, transformer_key_to_original),
        "text_encoder_post_modules": _original(connectors, connectors_key_to_original),
        **vae_part_files(vae, audio_vae),
        "audio_vocoder": _original(vocoder, vocoder_key_to_original),
    }
    for name, state_dict in files.items():
        atomic_save_safetensors(state_dict, repo / f"{name}.safetensors", metadata=metadata)
    return repo


def vae_part_files(vae: torch.nn.Module, audio_vae: torch.nn.Module) -> dict[str, dict[str, torch.Tensor]]:
    """``{file stem: tensors}`` of the four VAE halves of a Repackage repo (``video_vae_encoder``, ...) for these
    diffusers VAEs, under LTX-2's key names."""
    video = _with_unused_statistics(_original(vae, video_vae_key_namer(dict(vae.config))))
    return {**_halves("video_vae", video), **_halves("audio_vae", _original(audio_vae, audio_vae_key_to_original))}


def _with_unused_statistics(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Adds the statistics LTX-2's video VAE files hold beyond the two diffusers reads (loading skips them)."""
    means = state_dict["vae.per_channel_statistics.mean-of-means"]
    return {**state_dict, "vae.per_channel_statistics.channel": torch.arange(len(means), dtype=means.dtype),
            "vae.per_channel_statistics.mean-of-stds": torch.ones_like(means)}


def _halves(name: str, state_dict: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """``{name}_encoder`` and ``{name}_decoder`` as the reference's splitter writes them: each half with the
    statistics."""
    prefix = "vae." if name == "video_vae" else "audio_vae."
    statistics = {key: tensor for key, tensor in state_dict.items()
                  if key.startswith(f"{prefix}per_channel_statistics.")}
    return {f"{name}_{half}": {**statistics, **{key: tensor for key, tensor in state_dict.items()
                                                if key.startswith(f"{prefix}{half}.")}}
            for half in ("encoder", "decoder")}


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
