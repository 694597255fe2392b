"""Full checkpoints that the tools load: a model trained in full, written as its diffusers folder or its release's file.

``--full_checkpoint_format`` (a comma list) picks what each save point of a run with ``--trainable_models`` writes
for every model trained in full (``dit``, ``dit2``, ``vae``, ...); ``<name>`` is ``epoch-<e>`` or ``step-<s>``:

- ``flat`` (the default, the reference's layout): ``<name>.safetensors``, the trained weights with
  ``--remove_prefix_in_ckpt`` removed, for DiffSynth-Studio and ``--resume_from_checkpoint <file>``; written by the
  logger from the trainable state dict.
- ``diffusers``: ``<name>.<model>/`` holding the class's own ``config.json`` (as ``save_pretrained`` writes it) and
  its weights as ``diffusion_pytorch_model.safetensors`` (diffusers) or ``model.safetensors`` (transformers), split
  into ``-0000i-of-0000n`` shards with the standard ``*.safetensors.index.json`` above ``max_shard_size``. diffusers'
  and transformers' ``from_pretrained`` and this package's ``--model_paths`` load the folder as it is.
- ``original``: the layout of the model's original release, for ComfyUI: FLUX.1's transformer as BFL's single file
  ``<name>.<model>.original.safetensors`` (``pipelines/flux/original.py``), Wan's DiT as the Wan release
  folder ``<name>.<model>.original/`` (``config.json`` naming ``WanModel`` and one
  ``diffusion_pytorch_model.safetensors`` under the original names, ``pipelines/wan_video/original.py``): ComfyUI loads
  that file, this package loads the folder. Qwen-Image, Z-Image and FLUX.2 are released as diffusers folders, so
  ``original`` is refused for them (``diffusers`` is their original layout).

None of these names collides with the training-state folders ``checkpoints/step-<s>/``.

Memory: a model is read one block at a time (the tensors under one ``<list>.<index>.`` prefix, e.g.
``transformer_blocks.7``; the rest as one group), converted, and streamed into its file with
:class:`~diffsynth.core.safetensors_stream.SafetensorsStream`, so saving holds one block of the model beyond what
training holds. Under ZeRO-3 each block is gathered from its partitions just for that moment (a collective: every
process runs the writer, only the main one writes), so no process ever holds the whole model. A conversion only ever
joins tensors of one block (FLUX.1's fused ``qkv``), which is what lets it run block by block.

Every target is written under a temporary name (``.<target>.tmp``) and renamed when complete: a failure part way
leaves no folder or file under the final name, and an earlier one of the same name is replaced only by a complete one.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...core.files import atomic_write_json
from ...core.finite import require_finite
from ...core.safetensors_stream import SafetensorsStream, planned_nbytes
from ...core.written_files import record_written, record_written_tree
from ...pipelines.registry import families, family_of_class, load
from ..config.output import FULL_CHECKPOINT_FORMATS
from ..placement.deepspeed import gathered_parameters

FLAT, DIFFUSERS, ORIGINAL = FULL_CHECKPOINT_FORMATS
DEFAULT_MAX_SHARD_SIZE = 5 * 10**9  # "5GB", as save_pretrained counts it
ORIGINAL_SUFFIX = ".original"
FORMAT_FLAG = "--full_checkpoint_format"

# One block: the tensors under the first "<name>.<index>." of a key (transformer_blocks.7, blocks.12).
_BLOCK = re.compile(r"^((?:[^.]+\.)*?[^.]+\.\d+)\.")
# The dtype that marks "not this block" in a conversion's probe: no model weight is complex.
_ELSEWHERE = torch.complex64

Converter = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
PlanEntry = tuple[str, tuple[int, ...], torch.dtype]


class FullCheckpointError(ValueError):
    """A full checkpoint cannot be written in the layout asked for; the message names the flag and the fix."""


def full_model_folder(output_path: str | os.PathLike, name: str, model_name: str) -> Path:
    """``<output_path>/<name>.<model_name>``: the diffusers folder of one trained model."""
    return Path(output_path) / f"{name}.{model_name}"


@dataclass(frozen=True)
class _OriginalLayout:
    """How one class's original release stores it: the converter, and whether it is a folder with a config."""

    convert: Converter
    folder_config: Callable[[torch.nn.Module], dict[str, Any] | None] | None  # None: a single file without config

    def config_of(self, model: torch.nn.Module) -> dict[str, Any] | None:
        """The ``config.json`` of ``model``'s original folder; None where its release is one file (the family's
        function may say so for one class: Wan2.2-Animate-2's single-file transformer)."""
        return None if self.folder_config is None else self.folder_config(model)


def _original_layout(model: torch.nn.Module) -> _OriginalLayout | None:
    """The original layout of ``model``'s family (``FamilySpec.original_checkpoint``), or None where its release is a
    diffusers folder."""
    spec = family_of_class(type(model).__name__)
    if spec is None or spec.original_checkpoint is None:
        return None
    written = spec.original_checkpoint
    return _OriginalLayout(load(written.convert), load(written.folder_config) if written.folder_config else None)


def original_layout_problem(model_name: str, model: torch.nn.Module) -> str | None:
    """Why ``--full_checkpoint_format original`` cannot write ``model``, or None when it can."""
    if _original_layout(model) is not None:
        return None
    own = [spec.title for spec in families() if spec.original_checkpoint is not None]
    folders = [spec.title for spec in families() if spec.original_checkpoint is None]
    return (f"{FORMAT_FLAG} original: {model_name} is a {type(model).__name__}, whose original release is its "
            f"diffusers folder ({_joined(folders)} ship diffusers folders; only {_joined(own, possessive=True)} "
            f"transformers have a layout of their own); use {FORMAT_FLAG} diffusers, which is that layout")


def _joined(titles: Sequence[str], possessive: bool = False) -> str:
    """``A, B and C`` (``A's and B's`` with ``possessive``)."""
    names = [f"{title}'s" if possessive else title for title in titles]
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)


def full_checkpoint_paths(output_path: str | os.PathLike, name: str, model_name: str, model: torch.nn.Module,
                          formats: Sequence[str]) -> dict[str, Path]:
    """``{format: folder or file}`` that :func:`write_full_model` writes for these formats (``flat`` left out)."""
    paths = {}
    if DIFFUSERS in formats:
        paths[DIFFUSERS] = full_model_folder(output_path, name, model_name)
    if ORIGINAL in formats:
        layout = _original_layout(model)
        stem = Path(output_path) / f"{name}.{model_name}{ORIGINAL_SUFFIX}"
        folder = layout is None or layout.config_of(model) is not None
        paths[ORIGINAL] = stem if folder else stem.with_name(stem.name + ".safetensors")
    return paths


def write_full_model(model: torch.nn.Module, output_path: str | os.PathLike, name: str, model_name: str,
                     formats: Sequence[str] = (DIFFUSERS,), weights: Mapping[str, torch.Tensor] | None = None, *,
                     dtype: torch.dtype | None = None, max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
                     is_main_process: bool = True, metadata: Mapping[str, str] | None = None) -> list[Path]:
    """Writes one trained model as full checkpoint ``name`` in each of ``formats`` (``flat`` is the logger's).

    This is the one entry for "write these weights of model ``dit`` as full checkpoint X" (the trainer's save
    points, EMA weights). Under ZeRO-3 call it on every process: it gathers the partitioned weights block by block.

    Args:
        model: The model, for its class, its config and every tensor ``weights`` lacks (buffers, frozen weights).
        output_path: The run's output folder.
        name: The checkpoint's name, e.g. ``"epoch-0"``, ``"step-500"`` or ``"epoch-0-ema"``.
        model_name: The pipeline's name of the model (``dit``), part of the file names.
        formats: ``diffusers`` and / or ``original``.
        weights: Tensors under the model's own names (``transformer_blocks.0.attn.to_q.weight``) to write instead of
            the model's, e.g. EMA weights; None writes the model's own.
        dtype: Storage dtype of floating tensors; None keeps each tensor's.
        max_shard_size: Bytes per shard of the diffusers folder (one tensor larger than it gets a shard of its own).
        is_main_process: Whether this process writes (the others only take part in gathering).
        metadata: Extra safetensors metadata entries, e.g. ``{"step": "500"}``.

    Returns:
        The folders and files written (empty on a process other than the main one).

    Raises:
        FullCheckpointError: The model carries a LoRA (its LoRA file holds that), or ``original`` is asked for a
            class without a layout of its own.
        NonFiniteTensorError: A weight holds NaN or inf; nothing is left under the final names.
    """
    entries = _tensor_entries(model, weights)
    lora = [key for key in entries if ".lora_" in key or ".base_layer." in key]
    if lora:
        raise FullCheckpointError(f"{FORMAT_FLAG}: {model_name} carries a LoRA ({lora[0]!r}); a model is written in "
                                  "full only when it is trained in full without a LoRA (--trainable_models without "
                                  "--lora_base_model on it); its LoRA file holds the LoRA")
    if ORIGINAL in formats:
        problem = original_layout_problem(model_name, model)
        if problem:
            raise FullCheckpointError(problem)
    source = _BlockSource(entries, dtype, model_name)
    entries_metadata = {"format": "pt", **(metadata or {})}
    written = []
    for layout, target in full_checkpoint_paths(output_path, name, model_name, model, formats).items():
        if layout == DIFFUSERS:
            write = _diffusers_writer(model, source, max_shard_size, entries_metadata)
        else:
            write = _original_writer(model, source, entries_metadata)
        if is_main_process:
            written.append(_write_staged(target, write))
        else:
            write(None)  # gathers with the main process, writes nothing
    return written


def _tensor_entries(model: torch.nn.Module, weights: Mapping[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """Every tensor of the model's state dict in its order, taken from ``weights`` where it has it."""
    own = model.state_dict(keep_vars=True)
    if weights is not None:
        unknown = sorted(set(weights) - set(own))
        if unknown:
            raise FullCheckpointError(f"the weights to write name {unknown[:3]}, which {type(model).__name__} does "
                                      "not have; pass them under the model's own names")
    return {key: (weights[key] if weights is not None and key in weights else tensor) for key, tensor in own.items()}


def _shape(tensor: torch.Tensor) -> tuple[int, ...]:
    return tuple(getattr(tensor, "ds_shape", tensor.shape))  # a ZeRO-3 partition reports its whole shape there


class _BlockSource:
    """The model's tensors, block by block, on the CPU in the storage dtype (gathered from ZeRO-3 partitions)."""

    def __init__(self, entries: dict[str, torch.Tensor], dtype: torch.dtype | None, model_name: str) -> None:
        self.entries, self.dtype, self.model_name = entries, dtype, model_name
        blocks: dict[str, list[str]] = {}
        for key in entries:
            match = _BLOCK.match(key)
            blocks.setdefault(match[1] if match else "", []).append(key)
        self.blocks = list(blocks.values())

    def storage_dtype(self, tensor: torch.Tensor) -> torch.dtype:
        return self.dtype if self.dtype is not None and tensor.is_floating_point() else tensor.dtype

    def specs(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {key: (_shape(tensor), self.storage_dtype(tensor)) for key, tensor in self.entries.items()}

    def read(self, keys: list[str]) -> dict[str, torch.Tensor]:
        """The block's tensors; a collective under ZeRO-3. Every process checks them, so all stop on a NaN together."""
        tensors = [self.entries[key] for key in keys]
        partitioned = [tensor for tensor in tensors if hasattr(tensor, "ds_id")]
        with gathered_parameters(partitioned):
            block = {key: tensor.detach().to("cpu", self.storage_dtype(tensor), copy=hasattr(tensor, "ds_id"))
                     for key, tensor in zip(keys, tensors)}
        require_finite(block, f"not writing the full checkpoint of {self.model_name}: the weights")
        return block


def _converted_blocks(source: _BlockSource, convert: Converter | None) -> tuple[list[list[PlanEntry]], Callable]:
    """What each block becomes in the target layout (``(name, shape, dtype)`` in write order) and the function
    turning a block's tensors into the target's.

    A conversion sees the whole model, the block as meta tensors of their dtype and every other tensor as meta
    tensors of a marker dtype; what comes out in a real dtype is what that block makes.
    """
    specs = source.specs()
    if convert is None:
        plans = [[(key, *specs[key]) for key in block] for block in source.blocks]
        return plans, lambda block: block
    elsewhere = {key: torch.empty(shape, dtype=_ELSEWHERE, device="meta") for key, (shape, _) in specs.items()}

    def of_block(block: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {key: tensor for key, tensor in convert({**elsewhere, **block}).items() if tensor.dtype != _ELSEWHERE}

    plans = []
    for keys in source.blocks:
        probe = of_block({key: torch.empty(specs[key][0], dtype=specs[key][1], device="meta") for key in keys})
        plans.append([(key, tuple(tensor.shape), tensor.dtype) for key, tensor in probe.items()])
    whole = convert({key: torch.empty(shape, dtype=dtype, device="meta") for key, (shape, dtype) in specs.items()})
    planned = [entry[0] for plan in plans for entry in plan]
    if sorted(planned) != sorted(whole):  # a conversion joined tensors of two blocks: it cannot run block by block
        raise FullCheckpointError(f"{source.model_name}: converting block by block gives {len(planned)} tensors, the "
                                  f"whole model {len(whole)}; report this with the model's class")
    return plans, of_block


def _stream_blocks(source: _BlockSource, convert: Converter | None,
                   files: Callable[[list[PlanEntry]], list[tuple[Path | None, list[PlanEntry]]]],
                   metadata: Mapping[str, str]) -> dict[str, str]:
    """Reads, converts and writes the model block by block into the files ``files`` lays the plan out in.

    ``files`` gets the whole plan and returns ``(file, its entries in order)``; a file of None (a process that does
    not write) is read and discarded. Returns ``{tensor name: file name}``.
    """
    plans, to_target = _converted_blocks(source, convert)
    layout = files([entry for plan in plans for entry in plan])
    weight_map = {entry[0]: path.name for path, plan in layout if path is not None for entry in plan}
    pending = iter(layout)
    stream: SafetensorsStream | None = None
    remaining = 0

    def next_stream() -> None:
        nonlocal stream, remaining
        path, plan = next(pending)
        stream = None if path is None else SafetensorsStream(path, plan, metadata)
        remaining = len(plan)

    try:
        for keys, plan in zip(source.blocks, plans):
            block = source.read(keys)
            converted = to_target(block) if layout[0][0] is not None else {}
            del block
            for key, _, _ in plan:
                while remaining == 0:
                    if stream is not None:
                        stream.close()
                    next_stream()
                if stream is not None:
                    stream.write(key, converted.pop(key))
                remaining -= 1
        if stream is not None:
            stream.close()
    except BaseException:
        if stream is not None:
            try:
                stream.close()
            except ValueError:
                pass  # incomplete, as the error that got here already says
        raise
    return weight_map


def _split(plan: list[PlanEntry], max_bytes: int) -> list[list[PlanEntry]]:
    """Consecutive groups of at most ``max_bytes`` (a larger tensor alone), as ``save_pretrained`` splits."""
    shards: list[list[PlanEntry]] = [[]]
    size = 0
    for entry in plan:
        nbytes = planned_nbytes(entry[1], entry[2])
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += nbytes
    return shards


def _library_files(model: torch.nn.Module) -> tuple[str, str]:
    """``(weights file, index file)`` names the model's library loads."""
    from diffusers import ModelMixin

    if isinstance(model, ModelMixin):
        from diffusers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFETENSORS_WEIGHTS_NAME
    else:
        from transformers.utils import SAFE_WEIGHTS_INDEX_NAME
        from transformers.utils import SAFE_WEIGHTS_NAME as SAFETENSORS_WEIGHTS_NAME
    return SAFETENSORS_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME


def _save_config(model: torch.nn.Module, folder: Path) -> None:
    """The class's own ``config.json``, as its ``save_pretrained`` writes it."""
    if hasattr(model, "save_config"):  # diffusers
        model.save_config(folder)
    else:
        model.config.save_pretrained(folder)


def _diffusers_writer(model: torch.nn.Module, source: _BlockSource, max_shard_size: int,
                      metadata: Mapping[str, str]) -> Callable[[Path | None], None]:
    weights_name, index_name = _library_files(model)
    stem = weights_name.removesuffix(".safetensors")

    def write(folder: Path | None) -> None:
        def files(plan: list[PlanEntry]) -> list[tuple[Path | None, list[PlanEntry]]]:
            shards = _split(plan, max_shard_size)
            if folder is None:
                return [(None, shard) for shard in shards]
            if len(shards) == 1:
                return [(folder / weights_name, shards[0])]
            return [(folder / f"{stem}-{i:05d}-of-{len(shards):05d}.safetensors", shard)
                    for i, shard in enumerate(shards, start=1)]

        weight_map = _stream_blocks(source, None, files, metadata)
        if folder is None:
            return
        _save_config(model, folder)
        if len(set(weight_map.values())) > 1:
            total = sum(planned_nbytes(shape, dtype) for shape, dtype in source.specs().values())
            atomic_write_json(folder / index_name, {"metadata": {"total_size": total}, "weight_map": weight_map})

    return write


def _original_writer(model: torch.nn.Module, source: _BlockSource,
                     metadata: Mapping[str, str]) -> Callable[[Path | None], None]:
    layout = _original_layout(model)
    weights_name, _ = _library_files(model)

    config = layout.config_of(model)

    def write(target: Path | None) -> None:
        file = None if target is None else target / weights_name if config is not None else target
        _stream_blocks(source, layout.convert, lambda plan: [(file, plan)], metadata)
        if target is not None and config is not None:
            atomic_write_json(target / "config.json", config)

    return write


def _write_staged(target: Path, write: Callable[[Path], None]) -> Path:
    """Runs ``write`` on a temporary sibling of ``target`` (a folder, or a file for a ``.safetensors`` target) and
    renames it to ``target`` when complete; on failure the temporary one is removed and ``target`` is untouched."""
    staging = target.with_name(f".{target.name}.tmp")
    _remove(staging)
    target.parent.mkdir(parents=True, exist_ok=True)
    is_file = target.name.endswith(".safetensors")
    if not is_file:
        staging.mkdir()
    try:
        write(staging)
        _remove(target)
        os.replace(staging, target)
    except BaseException:
        _remove(staging)
        raise
    # --overwrite_output removes what the run recorded as its own
    if is_file:
        record_written(target)
    else:
        record_written_tree(target)
    return target


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)

