"""Training-state checkpoints for ``--resume_from_checkpoint``: weights, optimizer, schedule and data position.

A checkpoint is a folder ``<output_path>/checkpoints/step-<N>/`` holding

- ``trainable.safetensors``: the trainable weights, named as in the training module (``pipe.dit....``);
- ``state.safetensors``: the optimizer and learning-rate scheduler states (tensors by path, structure as JSON in the
  metadata; no pickle);
- ``progress.json``: optimizer step, micro-batch count, epoch, batches consumed in that epoch, the seed, the run id
  (``run_id``) and the flags that shape the trainable weights (``flags``, see :func:`training_flags`).

The folder is written under a temporary name and renamed when complete, so a run killed while saving leaves the
previous checkpoint as the latest. Random draws need no saved generator state: the sampler and the loss's per-step
generator are seeded from the run's seed, the epoch and the step.

Pruning (``--checkpoints_total_limit``) deletes only checkpoints of the saving run. ``latest`` skips a checkpoint
whose files cannot be read (a truncated safetensors file, broken JSON) for the newest one that can, and says so.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ...core.data.cache_codec import decode_tree, encode_tree
from ...core.files import atomic_save_safetensors, atomic_write_json
from ...core.finite import require_finite
from ..objective.training_module import TargetAliases, aliased_targets

if TYPE_CHECKING:
    from ..config import RunConfig

logger = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
_PREFIX = "step-"
_COUNTERS = ("global_step", "micro_step", "epoch", "batch_in_epoch", "seed")


class CheckpointError(ValueError):
    """A checkpoint cannot be resumed from; the message names the folder, what is wrong and what to do."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """``--resume_from_checkpoint`` names no checkpoint at all (a ``FileNotFoundError`` too, for callers that look
    for missing files)."""


def checkpoint_folder(output_path: str | os.PathLike, step: int) -> Path:
    """``<output_path>/checkpoints/step-<step>``."""
    return Path(output_path) / CHECKPOINTS_DIR / f"{_PREFIX}{step}"


def save_training_state(output_path: str | os.PathLike, trainable: Mapping[str, torch.Tensor],
                        optimizer_state: Mapping[str, Any], scheduler_state: Mapping[str, Any],
                        progress: Mapping[str, Any], keep_last: int | None = None) -> Path:
    """Writes one checkpoint folder for ``progress["global_step"]``, replacing one of the same step.

    Args:
        keep_last: Delete all but this many newest checkpoints of this run (``progress["run_id"]``) afterwards
            (``--checkpoints_total_limit``); None keeps all. A full fine-tune's checkpoint holds the weights and two
            optimizer moments, so keeping every one fills a disk quickly. Other runs' checkpoints are never deleted.

    Returns:
        The checkpoint folder.

    Raises:
        NonFiniteTensorError: A weight or optimizer state holds NaN or inf; nothing is written, so the newest
            checkpoint on disk stays one a resume can use.
    """
    folder = checkpoint_folder(output_path, int(progress["global_step"]))
    tensors, structure = encode_tree({"optimizer": dict(optimizer_state), "lr_scheduler": dict(scheduler_state)},
                                     "state")
    require_finite(trainable, f"not writing checkpoint {folder}: the trainable weights")
    require_finite(tensors, f"not writing checkpoint {folder}: the optimizer state")
    staging = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    atomic_save_safetensors(trainable, staging / "trainable.safetensors")
    atomic_save_safetensors(tensors, staging / "state.safetensors", {"structure": json.dumps(structure)})
    atomic_write_json(staging / "progress.json", dict(progress))
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(staging, folder)
    if keep_last is not None:
        mine = [(step, path) for step, path in _complete_checkpoints(output_path)
                if _run_id(path) == progress.get("run_id")]
        for _, old in sorted(mine)[:-keep_last]:
            shutil.rmtree(old)
    return folder


def _run_id(folder: Path) -> str | None:
    try:
        return read_progress(folder).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None  # unreadable: not provably this run's, so never pruned


def _complete_checkpoints(output_path: str | os.PathLike) -> list[tuple[int, Path]]:
    root = Path(output_path) / CHECKPOINTS_DIR
    return [(int(path.name[len(_PREFIX):]), path) for path in root.glob(f"{_PREFIX}*")
            if path.name[len(_PREFIX):].isdigit() and (path / "progress.json").is_file()]


def checkpoint_problem(folder: str | os.PathLike) -> str | None:
    """What makes ``folder`` unusable for resuming (unreadable progress, a truncated or foreign file), or None.

    Reads the JSON and the safetensors headers only; a safetensors header records every tensor's byte range, so a
    truncated file fails here without its tensors being read.
    """
    from safetensors import SafetensorError, safe_open

    folder = Path(folder)
    try:
        progress = read_progress(folder)
    except (OSError, ValueError) as error:
        return f"progress.json: {type(error).__name__}: {error}"
    missing = [key for key in _COUNTERS if not isinstance(progress, dict) or key not in progress]
    if missing:
        return f"progress.json lacks {missing}"
    for name in ("trainable.safetensors", "state.safetensors"):
        try:
            with safe_open(str(folder / name), framework="pt", device="cpu") as handle:
                if name == "state.safetensors":
                    json.loads((handle.metadata() or {})["structure"])
        except (SafetensorError, OSError, KeyError, ValueError) as error:
            return f"{name}: {type(error).__name__}: {error}"
    return None


def resolve_checkpoint(value: str, output_path: str | os.PathLike) -> Path:
    """Turns ``--resume_from_checkpoint`` (a folder, or ``latest``) into a readable checkpoint folder.

    ``latest`` takes the highest step whose files read; each newer one that does not is named in a warning.

    Raises:
        FileNotFoundError: No such checkpoint; the message names the flag, the value and where it looked.
        CheckpointError: The named checkpoint, or with ``latest`` every checkpoint, is unreadable.
    """
    if value == "latest":
        candidates = sorted(_complete_checkpoints(output_path), reverse=True)
    else:
        candidates = [(0, Path(value))] if (Path(value) / "progress.json").is_file() else []
    if not candidates:
        where = Path(output_path) / CHECKPOINTS_DIR if value == "latest" else Path(value)
        raise CheckpointNotFoundError(f"--resume_from_checkpoint {value}: no checkpoint at {where}; pass a "
                                      f"{CHECKPOINTS_DIR}/{_PREFIX}<N> folder written by an earlier run with the "
                                      "same --output_path, or drop the flag to start afresh")
    failed = []
    for _, folder in candidates:
        problem = checkpoint_problem(folder)
        if problem is None:
            if failed:
                logger.warning("--resume_from_checkpoint latest: skipping unreadable %s; resuming from %s instead",
                               "; ".join(f"{path} ({why})" for path, why in failed), folder)
            return folder
        failed.append((folder, problem))
    listed = "; ".join(f"{path}: {why}" for path, why in failed)
    if value == "latest":
        where = Path(output_path) / CHECKPOINTS_DIR
        raise CheckpointError(f"--resume_from_checkpoint latest: no checkpoint under {where} is readable ({listed}); "
                              "drop --resume_from_checkpoint and add --overwrite_output to start afresh")
    raise CheckpointError(f"--resume_from_checkpoint {value}: the checkpoint is unreadable ({listed}); pass another "
                          f"{CHECKPOINTS_DIR}/{_PREFIX}<N> folder, or latest to take the newest readable one")


def read_progress(folder: str | os.PathLike) -> dict[str, Any]:
    """The ``progress.json`` of a checkpoint folder."""
    return json.loads((Path(folder) / "progress.json").read_text())


def load_training_state(folder: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict, dict, dict]:
    """Reads ``(trainable, optimizer_state, scheduler_state, progress)`` from a checkpoint folder, on the CPU.

    Raises:
        CheckpointError: A file cannot be read; the message names the folder.
    """
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    folder = Path(folder)
    try:
        trainable = load_file(str(folder / "trainable.safetensors"))
        with safe_open(str(folder / "state.safetensors"), framework="pt", device="cpu") as handle:
            structure = json.loads(handle.metadata()["structure"])
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 - not a dict
        state = decode_tree(tensors, structure)
        progress = read_progress(folder)
    except (SafetensorError, OSError, KeyError, ValueError) as error:
        raise CheckpointError(f"--resume_from_checkpoint: cannot read the checkpoint {folder} "
                              f"({type(error).__name__}: {error}); resume from another checkpoint folder") from error
    return trainable, state["optimizer"], state["lr_scheduler"], progress


def training_flags(run: RunConfig, target_aliases: TargetAliases, num_processes: int = 1) -> dict[str, Any]:
    """The flags that fix the shape and meaning of the trainable weights and of the optimizer state, and the order of
    the data (batch size, buckets, accumulation and the process count: a resume skips the batches its epoch
    consumed, counted in micro-batches of all processes), as a checkpoint records them.

    Target modules are compared after the pipeline's aliases (``q`` -> ``to_q``, FLUX.1's ``a_to_qkv`` -> its
    patterns) and as a set, with an unset ``--lora_target_modules`` already the model's defaults
    (``RunConfig.with_pipeline_defaults``); an unset alpha is the rank.
    """
    lora = run.lora.lora_base_model is not None
    batch_size = run.dataset.batch_size
    return {
        "lora_base_model": run.lora.lora_base_model,
        "lora_target_modules": sorted(aliased_targets(run.lora.targets, target_aliases)) if lora else None,
        "lora_rank": run.lora.lora_rank if lora else None,
        "lora_alpha": float(run.lora.lora_alpha or run.lora.lora_rank) if lora else None,
        "trainable_models": sorted(run.training.trainable),
        # The optimizer state in the checkpoint is the named class's (AdamW's when unset).
        "customized_optimizer": run.training.customized_optimizer,
        "batch_size": batch_size,
        "aspect_ratio_buckets": batch_size > 1 or run.dataset.aspect_ratio_buckets,
        "gradient_accumulation_steps": run.training.gradient_accumulation_steps,
        "num_processes": num_processes,
    }


def flag_mismatches(folder: str | os.PathLike, recorded: Mapping[str, Any] | None,
                    current: Mapping[str, Any]) -> list[str]:
    """One problem per flag whose value differs from the checkpoint's, naming both values and the fix.

    A checkpoint that recorded no flags (written before they were recorded) passes; its weights are still
    compared by name and shape when they are loaded.
    """
    if not recorded:
        return []
    problems = []
    for name, now in current.items():
        was = recorded.get(name, now)
        if was != now and name == "num_processes":
            problems.append(f"this run has {now} processes, but the checkpoint {folder} was trained on {was}: its "
                            f"position in the data counts batches of {was} processes; resume it as it was launched "
                            f"(accelerate launch --num_processes {was} ...), or start a new run without "
                            "--resume_from_checkpoint (another --output_path, or --overwrite_output)")
        elif was != now:
            shown_was, shown_now = (_flag_text(value) for value in (was, now))
            note = " (an unset --lora_alpha equals --lora_rank)" if name == "lora_alpha" else ""
            problems.append(f"--{name} {shown_now}: the checkpoint {folder} was trained with --{name} {shown_was}"
                            f"{note}; resume with --{name} {shown_was}, or start a new run without "
                            "--resume_from_checkpoint (another --output_path, or --overwrite_output)")
    return problems


def _flag_text(value: Any) -> str:
    if value is None or value == []:
        return "(unset)"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return f"{value:g}" if isinstance(value, float) else str(value)
