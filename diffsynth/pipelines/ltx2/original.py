"""LTX-2's own checkpoint layout (Lightricks' ``ltx-2-19b-*.safetensors`` and the reference's repackaged parts),
loaded into diffusers' classes.

The reference (DiffSynth-Studio) trains from ``DiffSynth-Studio/LTX-2-Repackage`` and ``LTX-2.3-Repackage``: the
official single file cut into one file per component, each keeping the official key names:

==================================  =========================================  ========================================
file                                official keys                              diffusers class
==================================  =========================================  ========================================
``transformer.safetensors``         ``model.diffusion_model.*`` (no            ``LTX2VideoTransformer3DModel``
                                    ``*_embeddings_connector``)
``text_encoder_post_modules``       ``text_embedding_projection.*``,           ``LTX2TextConnectors``
                                    ``model.diffusion_model.{video,audio}_
                                    embeddings_connector.*``
``video_vae_{encoder,decoder}``     ``vae.{encoder,decoder}.*``,               ``AutoencoderKLLTX2Video`` (each half
                                    ``vae.per_channel_statistics.*``           alone, or joined; ``original_vae``)
``audio_vae_{encoder,decoder}``     ``audio_vae.{encoder,decoder}.*``,         ``AutoencoderKLLTX2Audio`` (likewise;
                                    ``audio_vae.per_channel_statistics.*``     ``original_audio``)
``audio_vocoder``                   ``vocoder.*``; LTX-2.3's                   ``LTX2Vocoder``; LTX-2.3's
                                    ``vocoder.{vocoder,bwe_generator,          ``LTX2VocoderWithBWE``
                                    mel_stft}.*``                              (``original_audio``)
==================================  =========================================  ========================================

Diffusers renamed few layers: the transformer's input projections (``patchify_proj`` -> ``proj_in``), its AdaLN
embedders (``adaln_single`` -> ``time_embed``; ``naming._EMBEDDERS``), the per-block audio-video modulation tables
and the query / key norms (``q_norm`` -> ``norm_q``); the connectors' blocks (``transformer_1d_blocks``) and the
Gemma feature projection (``text_embedding_projection.aggregate_embed`` -> ``text_proj_in``; LTX-2.3's one per
stream, ``video_aggregate_embed`` -> ``video_text_proj_in`` and the audio's likewise). The maps are written here as
diffusers -> official, and applied to every key of the class built from the file's config, so a key the file lacks
is named before anything loads and a key the file has beyond them is reported as unexpected.

Widths come from the tensors. How a width splits into attention heads, and the rotary settings, are not in the
tensors: they are read from the ``config`` JSON Lightricks writes in the file's safetensors metadata (its
``transformer`` section, under LTX-2's names) when present, else LTX-2's (32 heads of every attention, split rotary
embeddings in float64, the video VAE's 8 x 32 x 32 compression), which LTX-2.3 shares.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ...core.loader.errors import ModelLoadError
from ...core.loader.original_layout import OriginalModel, renamed_entries, single_file_entries
from ...core.loader.state_dict import CheckpointEntry
from ...core.model_traits import register_model_module
from .naming import _EMBEDDERS

# The connectors and the vocoder are kept in diffusers' LTX-2 pipeline package, not at its top level.
register_model_module("diffusers.pipelines.ltx2")

DIT_PREFIX = "model.diffusion_model."
_CONNECTORS = ("video_embeddings_connector", "audio_embeddings_connector")
_PROJECTION = "text_embedding_projection."
# Keys only LTX-2's VAEs and vocoder have in its own layout (latent statistics, the vocoders' first convolution or
# LTX-2.3's two generators); a file holding them next to the transformer holds every component (JoyAI-Echo's release).
_OTHER_COMPONENTS = ("vae.per_channel_statistics.", "audio_vae.per_channel_statistics.", "vocoder.conv_pre.",
                     "vocoder.vocoder.", "vocoder.bwe_generator.")
# LTX-2 and LTX-2.3: 32 heads in every attention; what the official code assumes when the metadata says nothing.
_HEADS = 32
# Gemma-3 12B's hidden width, which LTX-2.3's per-stream projections read and its metadata leaves out.
GEMMA_WIDTH = 3840
# LTX-2's settings that neither the tensors nor (always) the metadata record (diffusers' config of the release).
_DIT_DEFAULTS = {
    "patch_size": 1, "patch_size_t": 1, "vae_scale_factors": [8, 32, 32], "pos_embed_max_pos": 20,
    "base_height": 2048, "base_width": 2048, "audio_patch_size": 1, "audio_patch_size_t": 1, "audio_scale_factor": 4,
    "audio_pos_embed_max_pos": 20, "audio_sampling_rate": 16000, "audio_hop_length": 160, "rope_theta": 10000.0,
    "rope_double_precision": True, "rope_type": "split", "timestep_scale_multiplier": 1000,
    "cross_attn_timestep_scale_multiplier": 1000,
}  # fmt: skip
_CONNECTOR_DEFAULTS = {"connector_rope_base_seq_len": 4096, "rope_theta": 10000.0, "rope_double_precision": True,
                       "rope_type": "split", "causal_temporal_positioning": False}
# The official metadata's names -> diffusers' config (each maps one value).
_METADATA_NAMES = {
    "num_attention_heads": "num_attention_heads", "attention_head_dim": "attention_head_dim",
    "audio_num_attention_heads": "audio_num_attention_heads", "audio_attention_head_dim": "audio_attention_head_dim",
    "rope_type": "rope_type", "positional_embedding_theta": "rope_theta",
    "timestep_scale_multiplier": "timestep_scale_multiplier",
    "av_ca_timestep_scale_multiplier": "cross_attn_timestep_scale_multiplier",
}  # fmt: skip


def identify(files: list[Path]) -> OriginalModel | None:
    """The LTX-2 component one official-layout file holds (the transformer, the text connectors, a VAE or half of
    one, the vocoder), or None.

    A file holding every component (Lightricks' single files, JoyAI-Echo's release) loads as its transformer, with
    the other components in ``OriginalModel.others`` (``original_bundle``).

    Raises:
        ModelLoadError: The file lacks tensors its structure needs, or holds a layout not read here; the message
            names the file.
    """
    found = single_file_entries(list(files))
    if found is None:
        return None
    file, entries = found
    shapes = {key: entry.shape for key, entry in entries.items()}
    dit = [key for key in shapes if key.startswith(DIT_PREFIX) and not _is_connector(key)]
    if dit and any(key.startswith(_OTHER_COMPONENTS) for key in shapes):
        from .original_bundle import single_file_model  # every component in one file (JoyAI-Echo's release)

        return single_file_model(file, entries)
    if dit:
        return component_model(file, entries, "dit")
    if any(key.startswith(_PROJECTION) for key in shapes):
        return component_model(file, entries, "connectors")
    if any(key.startswith(_OTHER_COMPONENTS) for key in shapes):
        return _part(file, entries, shapes)
    return None


def component_model(file: Path, entries: dict[str, CheckpointEntry], kind: str) -> OriginalModel:
    """The transformer (``kind`` "dit") or the text connectors ("connectors") ``entries`` hold under LTX-2's names;
    a key of the class the entries lack is refused here, one they have beyond it is left for loading to report."""
    shapes = {key: entry.shape for key, entry in entries.items()}
    metadata = _metadata_section(file, "transformer")
    if kind == "dit":
        config = transformer_config(shapes, metadata, file)
        name, rename = "LTX2VideoTransformer3DModel", transformer_key_to_original
    else:
        config = connectors_config(shapes, metadata, file)
        name, rename = "LTX2TextConnectors", connectors_key_to_original
    keys = {key: rename(key) for key in _model_keys(name, config)}
    _refuse_missing(file, sorted(official for official in keys.values() if official not in shapes), name)
    used = set(keys.values())
    keys.update({key: key for key in shapes if key not in used})  # left as they are: reported as unexpected
    return OriginalModel(kind=kind, library="diffusers", class_name=name, config=config,
                         entries=renamed_entries(entries, keys), source=file)


def _part(file: Path, entries, shapes: dict[str, tuple[int, ...]]) -> OriginalModel:
    """A VAE or vocoder file of LTX-2-Repackage (one component's keys; ``original_vae``, ``original_audio``)."""
    from .original_audio import audio_vae_model, vocoder_model
    from .original_vae import video_vae_model

    readers = {"vae.": ("vae", video_vae_model), "audio_vae.": ("audio_vae", audio_vae_model),
               "vocoder.": ("vocoder", vocoder_model)}
    found = sorted({prefix for prefix in readers for key in shapes if key.startswith(prefix)})
    if len(found) != 1:
        raise ModelLoadError(f"{file} holds several LTX-2 components ({', '.join(p.rstrip('.') for p in found)}) "
                             "without the transformer; load each from its own file of LTX-2-Repackage")
    section, read = readers[found[0]]
    return read(file, entries, _metadata_section(file, section))


def _is_connector(key: str) -> bool:
    return key.startswith(tuple(DIT_PREFIX + name for name in _CONNECTORS))


def _metadata_section(file: Path, section: str) -> dict[str, Any]:
    """A section of the ``config`` JSON in the file's safetensors metadata; empty where there is none."""
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as handle:
        text = (handle.metadata() or {}).get("config")
    if not text:
        return {}
    try:
        return dict(json.loads(text).get(section) or {})
    except (ValueError, AttributeError):
        raise ModelLoadError(f"{file}: the 'config' entry of its safetensors metadata is not the JSON object LTX-2 "
                             "writes there; the file was altered: download it again") from None


def _model_keys(class_name: str, config: dict[str, Any]) -> list[str]:
    """The state-dict keys of ``class_name`` built from ``config`` on the meta device."""
    from accelerate import init_empty_weights

    from ...core.loader.loading import library_class

    with init_empty_weights():
        model = library_class("diffusers", class_name, class_name).from_config(config)
    return list(model.state_dict())


def _block_count(keys, prefix: str) -> int:
    pattern = re.compile(rf"^{re.escape(prefix)}\.(\d+)\.")
    return 1 + max((int(match[1]) for key in keys if (match := pattern.match(key))), default=-1)


def _shape(shapes: dict[str, tuple[int, ...]], key: str, file: Path, what: str) -> tuple[int, ...]:
    if key not in shapes:
        raise ModelLoadError(f"{file} lacks {key!r}, which every LTX-2 {what} has; the file is incomplete (an "
                             "interrupted download?): download it again")
    return shapes[key]


def _heads(width: int, heads: int, head_dim: int | None, file: Path, what: str) -> tuple[int, int]:
    """``(heads, head dim)`` of a ``width``-wide attention, the head dim given or the width split into ``heads``."""
    if head_dim is None:
        head_dim = width // heads
    if heads * head_dim != width:
        raise ModelLoadError(f"{file}: the {what} attention is {width} wide, which {heads} heads of {head_dim} do not "
                             "make; the metadata's head counts do not fit the tensors: download the file again")
    return heads, head_dim


# ---- the transformer -------------------------------------------------------------------------------------------------


def transformer_config(shapes: dict[str, tuple[int, ...]], metadata: dict[str, Any], file: Path) -> dict[str, Any]:
    """The ``LTX2VideoTransformer3DModel`` config of an official transformer file: widths from its tensors, heads and
    rotary settings from its metadata (``metadata``: the ``transformer`` section) or LTX-2's.

    Raises:
        ModelLoadError: A tensor the sizes are read from is missing, or the head counts do not divide the widths.
    """
    p = DIT_PREFIX
    width, in_channels = _shape(shapes, f"{p}patchify_proj.weight", file, "transformer")
    audio_width, audio_in = _shape(shapes, f"{p}audio_patchify_proj.weight", file, "transformer")
    named = {_METADATA_NAMES[key]: value for key, value in metadata.items() if key in _METADATA_NAMES}
    heads = _heads(width, named.pop("num_attention_heads", _HEADS), named.pop("attention_head_dim", None), file,
                   "video")
    audio_heads = _heads(audio_width, named.pop("audio_num_attention_heads", _HEADS),
                         named.pop("audio_attention_head_dim", None), file, "audio")
    if "frequencies_precision" in metadata:
        named["rope_double_precision"] = metadata["frequencies_precision"] == "float64"
    if "positional_embedding_max_pos" in metadata:
        named["pos_embed_max_pos"], named["base_height"], named["base_width"] = metadata["positional_embedding_max_pos"]
    block = f"{p}transformer_blocks.0."
    cross_attn_mod = _shape(shapes, f"{p}adaln_single.linear.weight", file, "transformer")[0] == 9 * width
    audio_cross_attn_mod = _shape(shapes, f"{p}audio_adaln_single.linear.weight", file, "transformer")[0] \
        == 9 * audio_width
    caption = f"{p}caption_projection.linear_1.weight"
    return {
        **_DIT_DEFAULTS, **named, "in_channels": in_channels,
        "out_channels": _shape(shapes, f"{p}proj_out.weight", file, "transformer")[0],
        "num_attention_heads": heads[0], "attention_head_dim": heads[1],
        "audio_in_channels": audio_in,
        "audio_out_channels": _shape(shapes, f"{p}audio_proj_out.weight", file, "transformer")[0],
        "audio_num_attention_heads": audio_heads[0], "audio_attention_head_dim": audio_heads[1],
        "cross_attention_dim": _shape(shapes, f"{block}attn2.to_k.weight", file, "transformer")[1],
        "audio_cross_attention_dim": _shape(shapes, f"{block}audio_attn2.to_k.weight", file, "transformer")[1],
        "caption_channels": shapes[caption][1] if caption in shapes else width,
        "use_prompt_embeddings": caption in shapes,
        "num_layers": _block_count(shapes, f"{p}transformer_blocks"),
        "gated_attn": f"{block}attn1.to_gate_logits.weight" in shapes,
        "audio_gated_attn": f"{block}audio_attn1.to_gate_logits.weight" in shapes,
        # LTX-2.3 modulates the cross-attention too: nine AdaLN parameters per block rather than six
        "cross_attn_mod": cross_attn_mod, "audio_cross_attn_mod": audio_cross_attn_mod,
        # no tensors: the attention processor that can skip attention for STG, which diffusers' LTX-2.3 config has
        "perturbed_attn": cross_attn_mod or audio_cross_attn_mod,
        # only read with that modulation, whose prompt embedder a file may leave out (LTX-2.5's)
        "use_prompt_adaln_single": f"{p}prompt_adaln_single.linear.weight" in shapes
        or not (cross_attn_mod or audio_cross_attn_mod),
        "attention_bias": f"{block}attn1.to_q.bias" in shapes,
        "attention_out_bias": f"{block}attn1.to_out.0.bias" in shapes,
        "ff_bias": f"{block}ff.net.0.proj.bias" in shapes,
        "audio_ff_bias": f"{block}audio_ff.net.0.proj.bias" in shapes,
    }  # fmt: skip


# diffusers -> official: block tables and query / key norms (inside blocks), then the top-level layers.
_BLOCK_RENAMES = (("video_a2v_cross_attn_scale_shift_table", "scale_shift_table_a2v_ca_video"),
                  ("audio_a2v_cross_attn_scale_shift_table", "scale_shift_table_a2v_ca_audio"),
                  (".norm_q.", ".q_norm."), (".norm_k.", ".k_norm."))
_TOP_RENAMES = {"proj_in": "patchify_proj", "audio_proj_in": "audio_patchify_proj", **_EMBEDDERS}


def _renamed(key: str) -> str:
    for new, old in _BLOCK_RENAMES:
        key = key.replace(new, old)
    head, dot, rest = key.partition(".")
    return _TOP_RENAMES.get(head, head) + dot + rest


def transformer_key_to_original(key: str) -> str:
    """The official name of an ``LTX2VideoTransformer3DModel`` key (``proj_in.weight`` ->
    ``model.diffusion_model.patchify_proj.weight``)."""
    return DIT_PREFIX + _renamed(key)


# ---- the text connectors ---------------------------------------------------------------------------------------------


def connectors_config(shapes: dict[str, tuple[int, ...]], metadata: dict[str, Any], file: Path) -> dict[str, Any]:
    """The ``LTX2TextConnectors`` config of a ``text_encoder_post_modules`` file: widths, depths, gates and registers
    from its tensors, heads from the metadata's ``connector_*`` entries or LTX-2's (its 3840-wide connectors have 30
    heads of 128: the head dim is the one kept).

    LTX-2 projects Gemma's features once, to the connectors' width (``aggregate_embed``); LTX-2.3 once per stream
    (``video_aggregate_embed``, ``audio_aggregate_embed``, with biases), to each stream's width, from features whose
    Gemma width only the metadata's ``caption_channels`` records (else Gemma-3 12B's 3840, which LTX-2.3 reads).

    Raises:
        ModelLoadError: A tensor the sizes are read from is missing, or the head count does not divide the width.
    """
    config = dict(_CONNECTOR_DEFAULTS)
    for modality in ("video", "audio"):
        prefix = f"{DIT_PREFIX}{modality}_embeddings_connector."
        width = _shape(shapes, f"{prefix}transformer_1d_blocks.0.attn1.to_q.weight", file, "text connector")[0]
        name = "connector" if modality == "video" else "audio_connector"
        head_dim = metadata.get(f"{name}_attention_head_dim", 128 if width % 128 == 0 else None)
        heads = metadata.get(f"{name}_num_attention_heads", width // head_dim if head_dim else _HEADS)
        heads, head_dim = _heads(width, heads, head_dim, file, f"{modality} connector")
        registers = shapes.get(f"{prefix}learnable_registers")
        config.update({
            f"{modality}_connector_num_attention_heads": heads, f"{modality}_connector_attention_head_dim": head_dim,
            f"{modality}_connector_num_layers": _block_count(shapes, f"{prefix}transformer_1d_blocks"),
            f"{modality}_connector_num_learnable_registers": registers[0] if registers else None,
            f"{modality}_gated_attn": f"{prefix}transformer_1d_blocks.0.attn1.to_gate_logits.weight" in shapes,
        })  # fmt: skip
    if f"{_PROJECTION}aggregate_embed.weight" in shapes:
        features = shapes[f"{_PROJECTION}aggregate_embed.weight"][1]
        caption_channels = config["video_connector_num_attention_heads"] * config["video_connector_attention_head_dim"]
        bias = f"{_PROJECTION}aggregate_embed.bias" in shapes
    else:
        video = _shape(shapes, f"{_PROJECTION}video_aggregate_embed.weight", file, "text projection")
        audio = _shape(shapes, f"{_PROJECTION}audio_aggregate_embed.weight", file, "text projection")
        features, caption_channels = video[1], metadata.get("caption_channels") or GEMMA_WIDTH
        bias = f"{_PROJECTION}video_aggregate_embed.bias" in shapes
        config.update(per_modality_projections=True, video_hidden_dim=video[0], audio_hidden_dim=audio[0])
    if features % caption_channels:
        raise ModelLoadError(f"{file}: the text projection reads {features} features, not a multiple of Gemma's "
                             f"width {caption_channels}; the file is not LTX-2's text_encoder_post_modules")
    if "rope_type" in metadata:
        config["rope_type"] = metadata["rope_type"]
    if "connector_positional_embedding_max_pos" in metadata:
        (config["connector_rope_base_seq_len"],) = metadata["connector_positional_embedding_max_pos"]
    if "frequencies_precision" in metadata:
        config["rope_double_precision"] = metadata["frequencies_precision"] == "float64"
    return {**config, "caption_channels": caption_channels, "text_proj_in_factor": features // caption_channels,
            "proj_bias": bias}


_PROJECTIONS = {"text_proj_in.": "aggregate_embed.", "video_text_proj_in.": "video_aggregate_embed.",
                "audio_text_proj_in.": "audio_aggregate_embed."}


def connectors_key_to_original(key: str) -> str:
    """The official name of an ``LTX2TextConnectors`` key (``text_proj_in.weight`` ->
    ``text_embedding_projection.aggregate_embed.weight``)."""
    for name, official in _PROJECTIONS.items():
        if key.startswith(name):
            return _PROJECTION + official + key.removeprefix(name)
    modality, _, rest = key.partition("_connector.")
    rest = rest.replace("transformer_blocks.", "transformer_1d_blocks.", 1)
    rest = rest.replace(".norm_q.", ".q_norm.").replace(".norm_k.", ".k_norm.")
    return f"{DIT_PREFIX}{modality}_embeddings_connector.{rest}"


def _refuse_missing(file: Path, missing: list[str], what: str) -> None:
    if missing:
        shown = ", ".join(repr(key) for key in missing[:10])
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        raise ModelLoadError(f"{file} lacks {len(missing)} tensor(s) of the LTX-2 {what} its other tensors describe: "
                             f"{shown}{more}; the file is incomplete (an interrupted download or a partial export): "
                             "download it again")
