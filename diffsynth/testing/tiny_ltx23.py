"""A tiny random-weight LTX-2.3, in the released diffusers layout (``diffusers/LTX-2.3-Diffusers``) and in the
reference's repackaged one (``DiffSynth-Studio/LTX-2.3-Repackage``: the transformer, ``text_encoder_post_modules``,
the four VAE halves, ``video_vae_encoder`` ... ``audio_vae_decoder``, and ``audio_vocoder``), and JoyAI-Echo's release
(``jd-opensource/JoyAI-Echo:JoyAI-Echo-release.safetensors``: every component in one file).

What LTX-2.3 changes against LTX-2 (diffusers' conversion config of the release), every switch on here:

- the transformer (``transformer/``): gated attention in both streams (``gated_attn``, ``audio_gated_attn``), the
  prompt cross-attention modulated by the timestep (``cross_attn_mod``, ``audio_cross_attn_mod``: nine AdaLN
  parameters per block and the ``prompt_adaln`` embedders), no caption projection (``use_prompt_embeddings=False``:
  the connectors hand each stream prompt tokens of its own cross-attention width) and the STG-ready attention
  (``perturbed_attn``);
- the text connectors (``connectors/``): one Gemma feature projection per stream (``per_modality_projections``, with
  biases) to the video and the audio width, gated attention and learnable registers in both connectors;
- the vocoder (``vocoder/``): ``LTX2VocoderWithBWE``, a vocoder at the audio VAE's 16 kHz followed by a bandwidth
  extender that writes 48 kHz, three times the rate, as the release's.

The Gemma-3 text encoder, its tokenizer, the video VAE, the audio VAE and the scheduler are the tiny LTX-2's
(``tiny_ltx2``; the release changed the VAEs' depth and kept their interfaces). The bandwidth extender's STFT holds a
Hann-windowed DFT and a random non-negative mel filter bank (the release stores both as buffers; diffusers builds them
as zeros), so the extender sees the first vocoder's sound. The repackaged files carry the ``config`` metadata
LTX-2's files do (the vocoder's in LTX-2.3's two sections, ``vocoder`` and ``bwe``, as the tiny's strides and rates are
not the release's), plus the Gemma width as ``caption_channels`` (the release leaves it out: its Gemma is always the
3840-wide 12B), which the per-stream projections do not record on their own.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from ..core.files import atomic_save_safetensors
from ..pipelines.ltx2.original import connectors_key_to_original, transformer_key_to_original
from ..pipelines.ltx2.original_audio import bwe_vocoder_key_to_original
from .tiny_common import prepare_repo, seeded
from .tiny_ltx2 import (
    _COMPONENTS,
    _SEEDS,
    AUDIO_MEL_BINS,
    TEXT_HIDDEN_SIZE,
    _audio_vae,
    _connectors,
    _transformer,
    _video_vae,
    write_ltx2_repo,
)
from .tiny_ltx2_repackage import _original, audio_vae_section, official_metadata, vae_part_files

LTX23_MODEL_ID = "diffusers/LTX-2.3-Diffusers"
LTX23_REPACKAGE_MODEL_ID = "DiffSynth-Studio/LTX-2.3-Repackage"
JOYAI_ECHO_MODEL_ID = "jd-opensource/JoyAI-Echo"
JOYAI_ECHO_FILE = "JoyAI-Echo-release.safetensors"
# The diffusers folders as given to --model_id_with_origin_paths (the same as LTX-2's).
LTX23_PATTERNS = {
    "dit": "transformer/diffusion_pytorch_model*.safetensors",
    "text_encoder": "text_encoder/model*.safetensors",
    "connectors": "connectors/diffusion_pytorch_model.safetensors",
    "vae": "vae/diffusion_pytorch_model.safetensors",
    "audio_vae": "audio_vae/diffusion_pytorch_model.safetensors",
    "vocoder": "vocoder/diffusion_pytorch_model.safetensors",
    "tokenizer": "tokenizer/",
}
LTX23_REPACKAGE_PATTERNS = {"dit": "transformer.safetensors", "connectors": "text_encoder_post_modules.safetensors"}
LTX23_REPACKAGE_PARTS = {"vae_encoder": "video_vae_encoder.safetensors", "vae_decoder": "video_vae_decoder.safetensors",
                         "audio_vae_encoder": "audio_vae_encoder.safetensors",
                         "audio_vae_decoder": "audio_vae_decoder.safetensors",
                         "vocoder": "audio_vocoder.safetensors"}

# The transformer's LTX-2.3 switches (diffusers' conversion config of the release).
TRANSFORMER_SWITCHES = {"gated_attn": True, "audio_gated_attn": True, "cross_attn_mod": True,
                        "audio_cross_attn_mod": True, "use_prompt_embeddings": False, "perturbed_attn": True}
# The connectors' LTX-2.3 switches: per-stream projections to the transformer's cross-attention widths (16 and 8 on
# the tiny transformer), gated attention and registers (8 here; a prompt's length is a multiple of them).
CONNECTOR_SWITCHES = {
    "per_modality_projections": True, "proj_bias": True, "video_hidden_dim": 16, "audio_hidden_dim": 8,
    "video_connector_num_attention_heads": 2, "video_connector_attention_head_dim": 8,
    "audio_connector_num_attention_heads": 2, "audio_connector_attention_head_dim": 4,
    "video_gated_attn": True, "audio_gated_attn": True,
    "video_connector_num_learnable_registers": 8, "audio_connector_num_learnable_registers": 8,
}  # fmt: skip
# The vocoder writes 16 kHz (the audio VAE's rate), the extender 3 x 16 kHz: its upsampling is 3 x its STFT hop.
BWE_HOP, BWE_FILTER, BWE_MEL_BINS = 4, 16, 4
VOCODER_INPUT_RATE, VOCODER_OUTPUT_RATE = 16000, 48000

_COMPONENTS_23 = {**_COMPONENTS, "vocoder": ("ltx2", "LTX2VocoderWithBWE")}


def _transformer_23():
    return _transformer(**TRANSFORMER_SWITCHES)


def _connectors_23():
    return _connectors(**CONNECTOR_SWITCHES)


def _stft_buffers(vocoder: torch.nn.Module) -> None:
    """Fills the extender's STFT buffers its forward reads (zeros as diffusers builds them): a Hann-windowed DFT and a
    random non-negative mel filter bank."""
    stft = vocoder.mel_stft.stft_fn
    length = stft.forward_basis.shape[-1]
    frequencies = torch.arange(length // 2 + 1, dtype=torch.float64)[:, None]
    angle = 2 * math.pi * frequencies * torch.arange(length, dtype=torch.float64)[None] / length
    window = torch.hann_window(length, periodic=True, dtype=torch.float64)
    basis = torch.cat([torch.cos(angle), -torch.sin(angle)]) * window
    with torch.no_grad():
        stft.forward_basis.copy_(basis[:, None].float())
        vocoder.mel_stft.mel_basis.copy_(torch.rand_like(vocoder.mel_stft.mel_basis))


def _vocoder_23():
    from diffusers.pipelines.ltx2.vocoder import LTX2VocoderWithBWE

    vocoder = LTX2VocoderWithBWE(
        in_channels=2 * AUDIO_MEL_BINS, hidden_channels=32, out_channels=2, upsample_kernel_sizes=[4, 4],
        upsample_factors=[2, 2], resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]],
        bwe_in_channels=2 * BWE_MEL_BINS, bwe_hidden_channels=32, bwe_out_channels=2,
        bwe_upsample_kernel_sizes=[5, 4, 4], bwe_upsample_factors=[3, 2, 2], bwe_resnet_kernel_sizes=[3],
        bwe_resnet_dilations=[[1, 3, 5]], filter_length=BWE_FILTER, hop_length=BWE_HOP, window_length=BWE_FILTER,
        num_mel_channels=BWE_MEL_BINS, input_sampling_rate=VOCODER_INPUT_RATE,
        output_sampling_rate=VOCODER_OUTPUT_RATE,
    )  # fmt: skip
    _stft_buffers(vocoder)
    return vocoder


def _generator_section(config, prefix: str) -> dict:
    """One generator's part of LTX-2.3's ``vocoder`` metadata (LTX-2's names) for a diffusers vocoder ``config``."""
    final = config[f"{prefix}final_act_fn"]
    return {"upsample_initial_channel": config[f"{prefix}hidden_channels"], "resblock": "AMP1",
            "upsample_rates": list(config[f"{prefix}upsample_factors"]),
            "upsample_kernel_sizes": list(config[f"{prefix}upsample_kernel_sizes"]),
            "resblock_kernel_sizes": list(config[f"{prefix}resnet_kernel_sizes"]),
            "resblock_dilation_sizes": [list(d) for d in config[f"{prefix}resnet_dilations"]],
            "activation": config[f"{prefix}act_fn"], "use_bias_at_final": config[f"{prefix}final_bias"],
            "apply_final_activation": final is not None, "use_tanh_at_final": final == "tanh"}


def bwe_vocoder_section(vocoder: torch.nn.Module) -> dict:
    """The ``vocoder`` section of LTX-2.3's ``config`` metadata (``{"vocoder": ..., "bwe": ...}``) for this diffusers
    ``LTX2VocoderWithBWE``."""
    config = vocoder.config
    return {"vocoder": _generator_section(config, ""),
            "bwe": {**_generator_section(config, "bwe_"), "input_sampling_rate": config.input_sampling_rate,
                    "output_sampling_rate": config.output_sampling_rate, "hop_length": config.hop_length,
                    "n_fft": config.filter_length, "num_mels": config.num_mel_channels}}


def build_tiny_ltx23(root: Path, model_id: str = LTX23_MODEL_ID, seed: int = 0) -> Path:
    """Writes the tiny LTX-2.3 at ``root/<model_id>`` in the diffusers layout (float32; ``LTX2Pipeline`` loads it).

    Seeds: ``seed`` plus LTX-2's offset per component, so the shared components equal the tiny LTX-2's.
    """
    return write_ltx2_repo(prepare_repo(root, model_id), seed, {"transformer": _transformer_23,
                                                                 "connectors": _connectors_23, "vocoder": _vocoder_23},
                           _COMPONENTS_23)


def build_tiny_ltx23_repackage(root: Path, model_id: str = LTX23_REPACKAGE_MODEL_ID, seed: int = 0) -> Path:
    """Writes the tiny LTX-2.3 transformer and text connectors (the same seeds as ``build_tiny_ltx23``'s) under
    LTX-2's key names at ``root/<model_id>``."""
    repo = prepare_repo(root, model_id)
    with seeded(seed + _SEEDS["transformer"]):
        transformer = _transformer_23()
    with seeded(seed + _SEEDS["connectors"]):
        connectors = _connectors_23()
    section = json.loads(official_metadata(transformer, connectors)["config"])
    section["transformer"]["caption_channels"] = TEXT_HIDDEN_SIZE
    metadata = {"config": json.dumps(section)}
    atomic_save_safetensors(_original(transformer, transformer_key_to_original), repo / "transformer.safetensors",
                            metadata=metadata)
    atomic_save_safetensors(_original(connectors, connectors_key_to_original),
                            repo / "text_encoder_post_modules.safetensors", metadata=metadata)
    with seeded(seed + _SEEDS["vae"]):
        vae = _video_vae()
    with seeded(seed + _SEEDS["audio_vae"]):
        audio_vae = _audio_vae()
    with seeded(seed + _SEEDS["vocoder"]):
        vocoder = _vocoder_23()
    # the audio models' sizes and rates, in which the tiny differs from the release
    metadata = {"config": json.dumps({**section, "audio_vae": audio_vae_section(audio_vae),
                                      "vocoder": bwe_vocoder_section(vocoder)})}
    files = {**vae_part_files(vae, audio_vae), "audio_vocoder": _original(vocoder, bwe_vocoder_key_to_original)}
    for name, tensors in files.items():
        atomic_save_safetensors(tensors, repo / f"{name}.safetensors", metadata=metadata)
    return repo


def build_tiny_joyai_echo(root: Path, model_id: str = JOYAI_ECHO_MODEL_ID, seed: int = 0) -> Path:
    """Writes ``JoyAI-Echo-release.safetensors`` at ``root/<model_id>``: every component of the tiny LTX-2.3 (the
    same seeds as ``build_tiny_ltx23``'s) in one file under LTX-2's key names, as Lightricks' single files and
    JoyAI-Echo's release hold them.

    The vocoder with bandwidth extension is written under its two generators' prefixes (``vocoder.vocoder.``,
    ``vocoder.bwe_generator.``, ``vocoder.mel_stft.``) in LTX-2's layer names, as LTX-2.3's release nests them.
    """
    repo = prepare_repo(root, model_id)
    models = {}
    for name, build in (("transformer", _transformer_23), ("connectors", _connectors_23), ("vae", _video_vae),
                        ("audio_vae", _audio_vae), ("vocoder", _vocoder_23)):
        with seeded(seed + _SEEDS[name]):
            models[name] = build()
    section = json.loads(official_metadata(models["transformer"], models["connectors"])["config"])
    section["transformer"]["caption_channels"] = TEXT_HIDDEN_SIZE
    section["audio_vae"] = audio_vae_section(models["audio_vae"])
    section["vocoder"] = bwe_vocoder_section(models["vocoder"])
    halves = vae_part_files(models["vae"], models["audio_vae"])
    tensors = {
        **_original(models["transformer"], transformer_key_to_original),
        **_original(models["connectors"], connectors_key_to_original),
        **{key: tensor for half in halves.values() for key, tensor in half.items()},
        **_original(models["vocoder"], bwe_vocoder_key_to_original),
    }
    atomic_save_safetensors(tensors, repo / JOYAI_ECHO_FILE, metadata={"config": json.dumps(section)})
    return repo


LTX23_BUILDERS = {"ltx23": build_tiny_ltx23, "ltx23_repackage": build_tiny_ltx23_repackage,
                  "joyai_echo": build_tiny_joyai_echo}
