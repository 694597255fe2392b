"""Checkpoint shards into a model built on the meta device, one shard at a time.

The checkpoint headers are read first (no tensor data) to map checkpoint keys to model keys and to reject unexpected
keys and shape mismatches before anything is allocated. Each shard is then read, cast to the target dtype, moved to
the target device and assigned into the model with ``load_state_dict(..., assign=True)``: the meta parameters are
replaced by the loaded tensors, so the weights are allocated once, and peak extra memory is one shard rather than the
whole model.

Shards are safetensors files, or the ``.pth`` state dicts of the original Wan releases (read only through ``pth.py``,
PyTorch's restricted loader). An entry may carry a ``convert`` function for checkpoints whose tensors differ from the
model's by more than their name (a fused qkv projection split in three, an extra leading axis).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ..file_memo import open_once, parsed
from .errors import ModelLoadError
from .pth import PTH_SUFFIX, PthCheckpoint

logger = logging.getLogger(__name__)

_SAFETENSORS_FIX = "it may be truncated by an interrupted download or copy; delete it and run again to re-download it"


@dataclass(frozen=True)
class CheckpointEntry:
    """Where one checkpoint tensor lives, read from the file's header only.

    Attributes:
        file: The shard holding the tensor.
        checkpoint_key: The tensor's name in that file.
        shape: The shape the model receives (after ``convert``).
        convert: Turns the stored tensor into the model's (e.g. one third of a fused qkv weight); None stores it as
            it is.
    """

    file: Path
    checkpoint_key: str
    shape: tuple[int, ...]
    convert: Callable[[torch.Tensor], torch.Tensor] | None = None


class _SafetensorsCheckpoint:
    """``safe_open`` behind the interface ``PthCheckpoint`` also offers (``keys``, ``shape``, ``get_tensor``)."""

    def __init__(self, file: Path) -> None:
        from safetensors import safe_open

        try:
            self._handle = safe_open(str(file), framework="pt", device="cpu")
        except Exception as error:  # noqa: BLE001 - SafetensorError, OSError and header decode errors alike
            raise ModelLoadError(f"{file} is not a valid safetensors file ({error}); {_SAFETENSORS_FIX}") from None

    def __enter__(self) -> _SafetensorsCheckpoint:
        self._handle.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._handle.__exit__(*exc_info)

    def keys(self) -> list[str]:
        return list(self._handle.keys())

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._handle.get_slice(key).get_shape())

    def get_tensor(self, key: str) -> torch.Tensor:
        return self._handle.get_tensor(key)


def open_checkpoint(file: Path) -> _SafetensorsCheckpoint | PthCheckpoint:
    """Opens a shard for reading: ``.pth`` through the restricted loader, anything else as safetensors."""
    return PthCheckpoint(file) if Path(file).suffix == PTH_SUFFIX else _SafetensorsCheckpoint(Path(file))


def _header_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    with open_once(file, open_checkpoint) as handle:
        names = handle.keys()
        return {key: handle.shape(key) for key in names}


def read_headers(files: list[Path]) -> dict[str, CheckpointEntry]:
    """Maps every checkpoint key to its file and shape, reading only the headers (once per file while it is
    unchanged: ``file_memo``).

    Raises:
        ModelLoadError: A file is not valid safetensors, or two shards hold the same key.
    """
    entries: dict[str, CheckpointEntry] = {}
    for file in files:
        try:
            shapes = parsed(file, "checkpoint header", _header_shapes)
        except FileNotFoundError:
            shapes = _header_shapes(file)  # the opener names the missing file in its own words
        for key, shape in shapes.items():
            if key in entries:
                raise ModelLoadError(
                    f"checkpoint key {key!r} is in both {entries[key].file} and {file}; the shards overlap, so "
                    "they are not one checkpoint (remove the stray file)"
                )
            entries[key] = CheckpointEntry(file=file, checkpoint_key=key, shape=shape)
    return entries


def transformers_key_renamer(model: torch.nn.Module):
    """Returns a function mapping a checkpoint key to the model's key, using transformers' own renaming rules.

    transformers 5 renames some checkpoint keys on load (Qwen2.5-VL files hold ``model.layers.*`` and ``visual.*``,
    the module tree has ``model.language_model.layers.*`` and ``model.visual.*``) and reverses it on save. Only pure
    renamings are applied; a rule that would also transform tensor data (fusing experts, splitting qkv) is refused,
    since loading it faithfully needs transformers' ``from_pretrained``.
    """
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming, rename_source_key
    except ImportError:  # older transformers: checkpoint keys are the module keys
        return lambda key, model_keys: key
    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if not isinstance(t, WeightRenaming)]
    prefix = getattr(model, "base_model_prefix", None) or None

    def rename(key: str, model_keys: dict) -> str:
        renamed, converter_pattern = rename_source_key(key, renamings, converters, prefix, model_keys)
        if converter_pattern is not None:
            raise ModelLoadError(
                f"checkpoint key {key!r} needs transformers' tensor conversion {converter_pattern!r} for "
                f"{type(model).__name__}; this loader only renames keys, load this model with from_pretrained"
            )
        return renamed

    return rename


def plan_keys(
    entries: dict[str, CheckpointEntry],
    expected: dict[str, torch.Tensor],
    rename=None,
    ignore_unexpected: tuple[str, ...] = (),
) -> dict[str, CheckpointEntry]:
    """Maps model keys to checkpoint entries, and rejects unexpected keys and shape mismatches.

    Args:
        entries: The checkpoint, from ``read_headers``.
        expected: The model's (meta) state dict.
        rename: ``rename(checkpoint_key, expected) -> model_key``; identity when None.
        ignore_unexpected: Regular expressions of checkpoint keys the model class declares safe to drop.

    Returns:
        ``{model_key: entry}`` for every checkpoint tensor the model takes.

    Raises:
        ModelLoadError: Naming every unexpected key, or the first shape mismatch with both shapes.
    """
    plan: dict[str, CheckpointEntry] = {}
    unexpected = []
    for key, entry in entries.items():
        model_key = rename(key, expected) if rename is not None else key
        if model_key not in expected:
            if any(re.search(pattern, key) for pattern in ignore_unexpected):
                logger.debug("dropping checkpoint key %s, which the model class ignores", key)
                continue
            unexpected.append((key, model_key))
            continue
        want = tuple(expected[model_key].shape)
        if entry.shape != want:
            raise ModelLoadError(
                f"shape mismatch for {model_key!r}: the checkpoint {entry.file} has {list(entry.shape)}, the "
                f"model built from config.json expects {list(want)}; the config.json and the weights come from "
                "different models"
            )
        plan[model_key] = entry
    if unexpected:
        unexpected.sort()
        shown = ", ".join(
            repr(entries[k].checkpoint_key) if entries[k].checkpoint_key == m else f"{entries[k].checkpoint_key!r} "
            f"(as {m!r})" for k, m in unexpected[:10]
        )
        more = f" and {len(unexpected) - 10} more" if len(unexpected) > 10 else ""
        raise ModelLoadError(
            f"{len(unexpected)} checkpoint key(s) are not in the model: {shown}{more} (first in "
            f"{entries[unexpected[0][0]].file}); the weights do not belong to the class in config.json, or the "
            "pattern matched files of another model"
        )
    return plan


def keeps_fp32(key: str, modules: tuple[str, ...]) -> bool:
    """Whether ``key`` lies in one of the modules a class keeps in float32 (matched on whole name parts)."""
    parts = key.split(".")
    return any(module in parts for module in modules)


def planned_by_file(plan: dict[str, CheckpointEntry]) -> dict[Path, list[tuple[str, CheckpointEntry]]]:
    """The planned ``(model_key, entry)`` pairs grouped by the shard holding them, in plan order."""
    by_file: dict[Path, list[tuple[str, CheckpointEntry]]] = {}
    for model_key, entry in plan.items():
        by_file.setdefault(entry.file, []).append((model_key, entry))
    return by_file


def read_planned(file: Path, keys: list[tuple[str, CheckpointEntry]], dtype: torch.dtype,
                 fp32_modules: tuple[str, ...] = ()) -> Iterator[tuple[str, torch.Tensor]]:
    """Reads the planned tensors of one shard, one at a time, converted and cast as the model stores them.

    Floating tensors are cast to ``dtype`` (float32 inside ``fp32_modules``); integer and bool tensors keep their
    type. The caller holds one tensor at a time, so reading costs one tensor of memory beyond where it is put.
    """
    with open_once(file, open_checkpoint) as handle:
        for model_key, entry in keys:
            try:
                tensor = handle.get_tensor(entry.checkpoint_key)
            except Exception as error:  # noqa: BLE001 - data past the end of a truncated file
                raise ModelLoadError(
                    f"{file}: cannot read tensor {entry.checkpoint_key!r} ({error}); {_SAFETENSORS_FIX}"
                ) from None
            if entry.convert is not None:
                tensor = entry.convert(tensor)
            if tensor.is_floating_point():
                tensor = tensor.to(dtype=torch.float32 if keeps_fp32(model_key, fp32_modules) else dtype)
            yield model_key, tensor


def assign_shards(
    model: torch.nn.Module,
    plan: dict[str, CheckpointEntry],
    dtype: torch.dtype,
    device: torch.device,
    fp32_modules: tuple[str, ...] = (),
) -> None:
    """Reads the planned tensors shard by shard and assigns them into the model.

    Floating tensors are cast to ``dtype`` (float32 inside ``fp32_modules``); integer and bool tensors keep their
    type. Casting happens on the CPU before the move, so the device never holds a wider copy.
    """
    for file, keys in planned_by_file(plan).items():
        shard = {model_key: tensor.to(device=device)
                 for model_key, tensor in read_planned(file, keys, dtype, fp32_modules)}
        result = model.load_state_dict(shard, strict=False, assign=True)
        if result.unexpected_keys:  # plan_keys already checked; this guards a class whose state_dict lies
            raise ModelLoadError(f"{file}: keys {result.unexpected_keys[:10]} were not taken by the model")
        del shard


def meta_tensor_names(model: torch.nn.Module) -> list[str]:
    """Names of parameters and buffers still on the meta device (never loaded)."""
    names = [name for name, p in model.named_parameters(remove_duplicate=False) if p.is_meta]
    names += [name for name, b in model.named_buffers(remove_duplicate=False) if b.is_meta]
    return sorted(set(names))
