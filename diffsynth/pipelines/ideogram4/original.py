"""Ideogram 4's own release layout (``DiffSynth-Studio/ideogram-4-bf16-repackage``, ``ideogram-ai/ideogram-4-fp8``),
loaded into diffusers' ``Ideogram4Transformer2DModel`` and transformers' ``Qwen3VLModel``.

The transformer file (``transformer/diffusion_pytorch_model.safetensors``, no config.json) holds Ideogram's module
tree, which the reference's ``Ideogram4DiT`` runs. It differs from diffusers' in two names per block:

==========================================  =======================================================
Ideogram                                    diffusers ``Ideogram4Transformer2DModel``
==========================================  =======================================================
``layers.N.attention.qkv`` (3 x width rows)  ``layers.N.attention.to_q`` / ``to_k`` / ``to_v`` (thirds)
``layers.N.attention.o``                     ``layers.N.attention.to_out.0``
==========================================  =======================================================

The fp8 release stores Linear weights as ``float8_e4m3fn`` with one float32 scale per output row beside them
(``X.weight_scale``, the compressed-tensors layout); they are dequantized to ``weight * scale`` one tensor at a time.
Its text encoder (``text_encoder/model.safetensors``) is ``Qwen3VLModel``'s state dict quantized the same way and
loads through the same rule, with the ``config.json`` of its folder.

The files do not record the rotary split of the head dim (``mrope_section``), its base or the norms' epsilon; the
reader uses the release's (diffusers' defaults), which fit only the released head dim of 256.

The NF4 release (``ideogram-ai/ideogram-4-nf4``) packs the Linear weights of both files in bitsandbytes' 4-bit layout
(``core.loader.nf4_layout``: ``X.weight`` packed uint8 with ``X.weight.absmax``, ``X.weight.quant_map`` and the JSON
blob ``X.weight.quant_state.bitsandbytes__nf4`` that records the shape). They stay packed: their layers load as
bitsandbytes ``Linear4bit``, the fused ``qkv`` split into ``to_q`` / ``to_k`` / ``to_v`` in packed form (each third
holds whole blocks of 64), so a LoRA trains over the frozen NF4 weights as over ``--quant_options``' own.
"""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ...core.loader.errors import ModelLoadError
from ...core.loader.nf4_layout import PackedWeight, check_split, is_statistic, packed_weights, unpacker
from ...core.loader.original_layout import OriginalModel, converted_entries, single_file_entries
from ...core.loader.state_dict import CheckpointEntry
from ...core.file_memo import read_json

_QKV = re.compile(r"^(layers\.\d+\.attention\.)qkv\.weight$")
_OUT = re.compile(r"^(layers\.\d+\.attention\.)o\.weight$")
_SCALE = ".weight_scale"
_TRANSFORMER_MARKER = "llm_cond_proj.weight"
_TEXT_MARKER = "language_model.layers.0.self_attn.q_proj.weight"
RELEASE_HEAD_DIM = 256


def _count(keys: list[str]) -> int:
    return 1 + max((int(match[1]) for key in keys if (match := re.match(r"^layers\.(\d+)\.", key))), default=-1)


def transformer_config(shapes: dict[str, tuple[int, ...]], file: Path | str) -> dict[str, Any]:
    """The ``Ideogram4Transformer2DModel`` config of an Ideogram-layout file, from its tensor shapes.

    Raises:
        ModelLoadError: A tensor the sizes are read from is missing, or the head dim is not the release's (the file
            does not record the rotary split another head dim would need).
    """
    try:
        width, in_channels = shapes["input_proj.weight"]
        (head_dim,) = shapes["layers.0.attention.norm_q.weight"]
        config = {"in_channels": in_channels, "num_layers": _count(list(shapes)), "attention_head_dim": head_dim,
                  "num_attention_heads": width // head_dim,
                  "intermediate_size": shapes["layers.0.feed_forward.w1.weight"][0],
                  "adaln_dim": shapes["adaln_proj.weight"][0], "llm_features_dim": shapes["llm_cond_proj.weight"][1]}
    except KeyError as missing:
        raise ModelLoadError(f"{file} looks like an Ideogram 4 transformer but lacks {missing.args[0]!r}; the file is "
                             "incomplete: download it again") from None
    if head_dim != RELEASE_HEAD_DIM:
        raise ModelLoadError(f"{file} has an Ideogram 4 head dim of {head_dim}; Ideogram's files do not record the "
                             f"rotary split, which is known only for the released {RELEASE_HEAD_DIM}: convert the "
                             "file to a diffusers folder with its config.json")
    return config


def _dequantize(file: Path, scale_key: str, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor * scale`` per row, the scale read from ``file`` when the tensor is real (on meta only its shape and
    the dequantized dtype count)."""
    if tensor.is_meta:
        return tensor.to(torch.float32)
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as handle:
        scale = handle.get_tensor(scale_key)
    return tensor.to(torch.float32) * scale.to(torch.float32).reshape(-1, 1)


def _third(index: int, convert: Any, tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor if convert is None else convert(tensor)
    return tensor.chunk(3, dim=0)[index]


def _sources(entries: dict[str, CheckpointEntry], rename: bool,
             packed: dict[str, PackedWeight]) -> dict[str, tuple[str, Any]]:
    """``{model key: (file key, convert)}``: fp8 scales folded into their weights, NF4 weights read packed, and with
    ``rename`` the fused attention split and renamed."""
    sources = {}
    for key, entry in entries.items():
        if key.endswith(_SCALE) or is_statistic(key):
            continue
        scale = key.removesuffix(".weight") + _SCALE
        convert = partial(_dequantize, entry.file, scale) if key.endswith(".weight") and scale in entries else None
        if key in packed:
            convert = unpacker(packed[key])
        if rename and (match := _QKV.match(key)):
            if key in packed:
                check_split(packed[key], 3)
            for index, name in enumerate(("to_q", "to_k", "to_v")):
                third = unpacker(packed[key], index, 3) if key in packed else partial(_third, index, convert)
                sources[f"{match[1]}{name}.weight"] = (key, third)
        elif rename and (match := _OUT.match(key)):
            sources[f"{match[1]}to_out.0.weight"] = (key, convert)
        else:
            sources[key] = (key, convert)
    return sources


def identify(files: list[Path]) -> OriginalModel | None:
    """The Ideogram 4 model ``files`` hold (one safetensors file in Ideogram's layout: the fused transformer, or a
    Qwen3-VL text encoder quantized to fp8 with its scales or packed in NF4), or None for anything else. Only headers
    are read, and the small JSON blobs of NF4 weights.

    Raises:
        ModelLoadError: The file lacks tensors its structure needs, holds 4-bit weights other than plain NF4, or (the
            text encoder) has no config.json beside it.
    """
    found = single_file_entries(list(files))
    if found is None:
        return None
    file, entries = found
    is_transformer = _TRANSFORMER_MARKER in entries and "layers.0.attention.to_q.weight" not in entries
    marker_stem = _TEXT_MARKER.removesuffix(".weight")
    is_quantized_text = _TEXT_MARKER in entries and any(
        key in entries for key in (marker_stem + _SCALE, _TEXT_MARKER + ".absmax"))
    if not (is_transformer or is_quantized_text):
        return None
    packed = packed_weights(file, entries)
    sources = _sources(entries, rename=is_transformer, packed=packed)
    packed_keys = frozenset(model_key for model_key, (key, _) in sources.items() if key in packed)
    if is_transformer:
        shapes = {key: packed[key].shape if key in packed else entry.shape for key, entry in entries.items()}
        return OriginalModel(kind="dit", library="diffusers", class_name="Ideogram4Transformer2DModel",
                             config=transformer_config(shapes, file), entries=converted_entries(entries, sources),
                             source=file, packed=packed_keys)
    if not (file.parent / "config.json").is_file():
        raise ModelLoadError(f"{file} is a quantized (fp8 or NF4) Qwen3-VL text encoder without a config.json beside "
                             "it; download the release's text_encoder/ folder whole")
    return OriginalModel(kind="text_encoder", library="transformers", class_name="Qwen3VLModel",
                         config=read_json(file.parent / "config.json"), entries=converted_entries(entries, sources),
                         source=file, packed=packed_keys)


def quantize_fp8(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state_dict`` as the fp8 release stores it: every 2-D ``.weight`` of a Linear as ``float8_e4m3fn`` with its
    float32 per-row ``weight_scale`` (the row's largest magnitude onto the format's 448); the rest unchanged."""
    out = {}
    for key, value in state_dict.items():
        if key.endswith(".weight") and value.dim() == 2 and "embed" not in key:
            scale = value.float().abs().amax(dim=1).clamp(min=1e-12) / torch.finfo(torch.float8_e4m3fn).max
            out[key] = (value.float() / scale[:, None]).to(torch.float8_e4m3fn)
            out[key.removesuffix(".weight") + _SCALE] = scale
        else:
            out[key] = value
    return out


def transformer_to_original(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An ``Ideogram4Transformer2DModel`` state dict in Ideogram's layout (the bf16 repackage's names): the
    attention projections fused into ``qkv``, ``to_out.0`` named ``o``. What the tiny repos and
    ``--full_checkpoint_format original`` write."""
    out = {}
    for key, value in state_dict.items():
        if key.endswith(".attention.to_q.weight"):
            stem = key.removesuffix("to_q.weight")
            out[stem + "qkv.weight"] = torch.cat([value, state_dict[stem + "to_k.weight"],
                                                  state_dict[stem + "to_v.weight"]])
        elif key.endswith((".attention.to_k.weight", ".attention.to_v.weight")):
            continue
        else:
            out[key.replace(".attention.to_out.0.", ".attention.o.")] = value
    return out
