"""bitsandbytes' prequantized 4-bit layout in a safetensors file, loaded as ``bitsandbytes.nn.Linear4bit`` layers.

A release saved from ``Linear4bit`` layers (``Linear4bit.state_dict()``, e.g. ``ideogram-ai/ideogram-4-nf4``) stores each
quantized Linear weight ``X.weight`` as the packed ``uint8`` tensor of shape ``((out * in + 1) // 2, 1)`` (two 4-bit
codes a byte, row-major), with beside it:

=============================================  ==========================================================
``X.weight.absmax``                            float32, the largest magnitude of each block of 64 values
``X.weight.quant_map``                         float32, the 16 code values (NormalFloat4)
``X.weight.quant_state.bitsandbytes__nf4``     JSON as uint8: ``quant_type``, ``blocksize``, ``dtype``, ``shape``
=============================================  ==========================================================

Double quantization (``compress_statistics=True``) adds ``X.weight.nested_absmax`` and ``X.weight.nested_quant_map``;
FP4 names the blob ``bitsandbytes__fp4``. Both are refused by name: the NF4 release is written without either (the
reference loads it with ``compress_statistics=False``), and the row split of a fused weight below needs plain absmax.

Loading keeps the weights packed: the model's ``nn.Linear`` of each packed weight becomes a ``Linear4bit`` built on
the meta device (``linear4bit_shells``), whose weight the loader assigns as a ``Params4bit`` made from the file's
statistics (``bitsandbytes.nn.Params4bit.from_prequantized``). The model is then exactly what ``--quant_options
<model>:bitsandbytes_nf4`` makes of a full-precision one: a LoRA trains over the frozen 4-bit weights.

A fused weight (several Linear layers' rows in one tensor, ``qkv``) splits into its layers' packed weights exactly
when each part holds whole blocks: packing and block statistics then run along the rows without crossing a part.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ..file_memo import open_once, parsed
from .errors import ModelLoadError
from .state_dict import CheckpointEntry, open_checkpoint

_BLOB = ".quant_state.bitsandbytes__"
_STATS = ("absmax", "quant_map", "nested_absmax", "nested_quant_map")


@dataclass(frozen=True)
class PackedWeight:
    """One Linear weight stored in bitsandbytes' 4-bit layout.

    Attributes:
        file: The safetensors file.
        key: The packed weight's checkpoint key (``X.weight``).
        shape: The weight's own shape, ``(out_features, in_features)``.
        blocksize: Values per absmax block.
        state: The JSON blob's fields (``quant_type``, ``blocksize``, ``dtype``, ``shape``).
    """

    file: Path
    key: str
    shape: tuple[int, int]
    blocksize: int
    state: dict[str, Any]

    def part_shape(self, parts: int) -> tuple[int, int]:
        """The shape of each of ``parts`` equal row slices."""
        return self.shape[0] // parts, self.shape[1]


def packed_shape(shape: tuple[int, int]) -> tuple[int, int]:
    """The stored shape of a packed ``(out, in)`` weight: two codes a byte, one column."""
    return (shape[0] * shape[1] + 1) // 2, 1


def is_statistic(key: str) -> bool:
    """Whether ``key`` is a packed weight's statistic (absmax, code map, JSON blob), not a weight of its own."""
    weight, dot, rest = key.rpartition(".weight.")
    return bool(dot and weight) and (rest in _STATS or rest.startswith(_BLOB.lstrip(".")))


def _read_states(file: Path) -> dict[str, dict[str, Any]]:
    """``{weight key: JSON blob}`` of every packed weight of ``file`` (the blobs are small tensors)."""
    states = {}
    with open_once(file, open_checkpoint) as handle:
        for key in handle.keys():
            if _BLOB in key:
                states[key.partition(_BLOB)[0]] = {"_blob": key, **json.loads(bytes(handle.get_tensor(key).tolist()))}
    return states


def packed_weights(file: Path, entries: dict[str, CheckpointEntry]) -> dict[str, PackedWeight]:
    """``{checkpoint key: PackedWeight}`` of every weight of ``file`` in bitsandbytes' layout (empty for none).

    Raises:
        ModelLoadError: A weight is FP4 or double-quantized, or lacks its packed tensor or a statistic.
    """
    if not any(_BLOB in key for key in entries):
        return {}
    found = {}
    for key, state in parsed(file, "bitsandbytes 4-bit states", _read_states).items():
        blob = state.pop("_blob")
        if state.get("quant_type") != "nf4" or f"{key}.nested_absmax" in entries:
            kind = "double-quantized (nested statistics)" if state.get("quant_type") == "nf4" else \
                f"quant type {state.get('quant_type')!r}"
            raise ModelLoadError(f"{file}: {key} is bitsandbytes {kind}; only NF4 without double quantization "
                                 "(compress_statistics=False, the NF4 releases' layout) is read here: re-save it so, "
                                 "or load a bf16 release with --quant_options <model>:bitsandbytes_nf4")
        missing = [name for name in (key, f"{key}.absmax", f"{key}.quant_map") if name not in entries]
        if missing:
            raise ModelLoadError(f"{file} has {blob} but lacks {missing}; the file is incomplete: download it again")
        shape = tuple(state["shape"])
        if entries[key].shape != packed_shape(shape):
            raise ModelLoadError(f"{file}: {key} has shape {list(entries[key].shape)}, not the packed "
                                 f"{list(packed_shape(shape))} of its recorded {list(shape)}; the file is damaged")
        found[key] = PackedWeight(file, key, shape, int(state["blocksize"]), state)
    return found


def check_split(packed: PackedWeight, parts: int) -> None:
    """Checks that ``packed`` splits into ``parts`` row slices of whole blocks (see the module docstring).

    Raises:
        ModelLoadError: It does not.
    """
    rows, columns = packed.part_shape(parts)
    if rows * parts != packed.shape[0] or (rows * columns) % packed.blocksize or (rows * columns) % 2:
        raise ModelLoadError(f"{packed.file}: the fused NF4 weight {packed.key} {list(packed.shape)} does not split "
                             f"into {parts} parts of whole {packed.blocksize}-value blocks, so its layers cannot be "
                             "read apart; load a bf16 release of the model with --quant_options instead")


def _unpack(packed: PackedWeight, index: int, parts: int, tensor: torch.Tensor) -> torch.Tensor:
    """The ``Params4bit`` of row slice ``index`` of ``parts`` of ``tensor`` (the packed weight read from the file);
    on meta, only the stored shape counts."""
    shape = packed.part_shape(parts)
    if tensor.is_meta:
        return torch.empty(packed_shape(shape), dtype=torch.uint8, device="meta")
    import bitsandbytes as bnb

    with open_once(packed.file, open_checkpoint) as handle:
        absmax = handle.get_tensor(f"{packed.key}.absmax")
        code = handle.get_tensor(f"{packed.key}.quant_map")
    stats = {**packed.state, "shape": list(shape), "absmax": absmax.chunk(parts)[index], "quant_map": code}
    return bnb.nn.Params4bit.from_prequantized(tensor.chunk(parts)[index], stats, requires_grad=False, device="cpu")


def unpacker(packed: PackedWeight, index: int = 0, parts: int = 1) -> Callable[[torch.Tensor], torch.Tensor]:
    """An entry's ``convert`` loading row slice ``index`` of ``parts`` of ``packed`` as a ``Params4bit``."""
    return partial(_unpack, packed, index, parts)


def linear4bit_shells(model: torch.nn.Module, weight_keys: Iterable[str], dtype: torch.dtype) -> None:
    """Replaces the ``nn.Linear`` owning each of ``weight_keys`` (``X.weight``) by a ``Linear4bit`` on the meta device
    computing in ``dtype``, whose weight has the packed shape the loader assigns.

    Raises:
        ModelLoadError: bitsandbytes is not installed, or a key names no Linear layer's weight.
    """
    from ..quant import bitsandbytes_available, empty_linear4bit

    weight_keys = list(weight_keys)
    if not bitsandbytes_available():
        raise ModelLoadError(f"{type(model).__name__}'s weights are packed in bitsandbytes' NF4 layout, which needs "
                             "bitsandbytes (not installed, or kept out of this process because no flag named it); "
                             "pip install -c constraints.txt bitsandbytes")
    for key in weight_keys:
        name, _, attribute = key.rpartition(".weight")[0].rpartition(".")
        parent = model.get_submodule(name)
        linear = getattr(parent, attribute, None)
        if not isinstance(linear, torch.nn.Linear):
            raise ModelLoadError(f"the packed NF4 tensor {key!r} is not the weight of a Linear layer of "
                                 f"{type(model).__name__}; the file belongs to another model")
        shell = empty_linear4bit(linear, dtype)
        # The packed shape, so that the loader's shape checks compare it with the file's.
        shell.weight.data = torch.empty(packed_shape((linear.out_features, linear.in_features)), dtype=torch.uint8,
                                        device="meta")
        setattr(parent, attribute, shell)
