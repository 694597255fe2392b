"""Training-state checkpoints for ``--resume_from_checkpoint``: weights, optimizer, schedule and data position.

A checkpoint is a folder ``<output_path>/checkpoints/step-<N>/`` holding

- ``trainable.safetensors``: the trainable weights, named as in the training module (``pipe.dit....``);
- ``state.safetensors``: the optimizer and learning-rate scheduler states (tensors by path, structure as JSON in the
  metadata; no pickle);
- ``progress.json``: optimizer step, micro-batch count, epoch, batches consumed in that epoch, the seed, the run id
  (``run_id``) and the flags that shape the trainable weights (``flags``, see :func:`training_flags`);
- ``ema.safetensors``: with ``--ema_decay``, the fp32 moving average of the trainable weights, named as they are
  (``loop.ema``); :func:`load_training_state` returns it in the progress under ``ema``.

The folder is written under a temporary name and renamed when complete, so a run killed while saving leaves the
previous checkpoint as the latest; a save that fails (a full disk) removes the temporary folder. Random draws need
no saved generator state: the sampler and the loss's per-step generator are seeded from the run's seed, the epoch
and the step.

Pruning (``--checkpoints_total_limit``) deletes only checkpoints of the saving run. ``latest`` skips a checkpoint
whose files cannot be read (a truncated safetensors file, broken JSON) for the newest one that can, and says so.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ...core.data.cache_codec import decode_tree, encode_tree
from ...core.disk_full import DiskFullError, format_bytes, free_bytes
from ...core.files import atomic_save_safetensors, atomic_write_json, safetensors_size
from ...core.finite import require_finite
from ...core.written_files import record_written_tree
from ..objective.lora_targets import TargetAliases, aliased_targets

if TYPE_CHECKING:
    from ..config import RunConfig

logger = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
EMA_FILE = "ema.safetensors"
#: The files of a checkpoint folder; pruning and replacing a checkpoint delete these and keep any other file.
CHECKPOINT_FILES = ("trainable.safetensors", "state.safetensors", EMA_FILE, "progress.json")
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
                        progress: Mapping[str, Any], keep_last: int | None = None,
                        ema: Mapping[str, torch.Tensor] | None = None) -> Path:
    """Writes one checkpoint folder for ``progress["global_step"]``, replacing one of the same step.

    Args:
        keep_last: Delete all but this many newest checkpoints of this run (``progress["run_id"]``) afterwards
            (``--checkpoints_total_limit``); None keeps all. A full fine-tune's checkpoint holds the weights and two
            optimizer moments, so keeping every one fills a disk quickly. Other runs' checkpoints are never deleted.
        ema: The EMA of the trainable weights (``--ema_decay``), written as ``ema.safetensors``; None writes none.

    Returns:
        The checkpoint folder.

    Raises:
        NonFiniteTensorError: A weight or optimizer state holds NaN or inf; nothing is written, so the newest
            checkpoint on disk stays one a resume can use.
        DiskFullError: The disk ran out of space; the staging folder is removed, and the message names the
            checkpoint, the space it needs and the space free.
    """
    folder = checkpoint_folder(output_path, int(progress["global_step"]))
    tensors, structure = encode_tree({"optimizer": dict(optimizer_state), "lr_scheduler": dict(scheduler_state)},
                                     "state")
    require_finite(trainable, f"not writing checkpoint {folder}: the trainable weights")
    require_finite(tensors, f"not writing checkpoint {folder}: the optimizer state")
    if ema is not None:
        require_finite(ema, f"not writing checkpoint {folder}: the EMA weights")
    staging = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        atomic_save_safetensors(trainable, staging / "trainable.safetensors")
        atomic_save_safetensors(tensors, staging / "state.safetensors", {"structure": json.dumps(structure)})
        if ema is not None:
            atomic_save_safetensors(dict(ema), staging / EMA_FILE)
        atomic_write_json(staging / "progress.json", dict(progress))
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)  # a failed save leaves no half-written checkpoint behind
        if isinstance(error, DiskFullError):
            sizes = (safetensors_size(trainable), safetensors_size(tensors), safetensors_size(dict(ema or {})))
            raise _disk_full(folder, staging, error, sum(sizes)) from error
        raise
    if folder.exists():  # an earlier run's checkpoint of this step: replaced, with any file of the user's kept in it
        _remove_checkpoint(folder, keep_in=staging)
    os.replace(staging, folder)
    record_written_tree(folder)  # its files were recorded under the staging name
    if keep_last is not None:
        mine = [(step, path) for step, path in _complete_checkpoints(output_path)
                if _run_id(path) == progress.get("run_id")]
        for _, old in sorted(mine)[:-keep_last]:
            _remove_checkpoint(old)
    return folder


def _remove_checkpoint(folder: Path, keep_in: Path | None = None) -> None:
    """Deletes the files a checkpoint holds, and ``folder`` once empty; any other file in it (a user's note) is kept:
    moved to the same place under ``keep_in``, or left where it is with a warning."""
    others = sorted(path for path in folder.rglob("*")
                    if not path.is_dir() and path.relative_to(folder).as_posix() not in CHECKPOINT_FILES)
    for name in CHECKPOINT_FILES:
        (folder / name).unlink(missing_ok=True)
    if keep_in is not None:
        for path in others:
            kept = keep_in / path.relative_to(folder)
            kept.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, kept)
    elif others:
        logger.warning("kept %s: it holds files this trainer did not write (%s)", folder,
                       ", ".join(path.relative_to(folder).as_posix() for path in others[:5]))
    for path in sorted((folder, *(path for path in folder.rglob("*") if path.is_dir())),
                       key=lambda path: len(path.parts), reverse=True):
        with contextlib.suppress(OSError):  # not empty: it holds a file that is not the trainer's
            path.rmdir()


def _disk_full(folder: Path, staging: Path, error: DiskFullError, needed: int) -> DiskFullError:
    """The error of a checkpoint the disk had no room for, its staging folder removed: the space the whole
    checkpoint needs against the space free, and what is still there to resume from."""
    free = free_bytes(folder.parent)
    have = f"{format_bytes(free)} are free" if free is not None else "the free space cannot be read"
    amount = f"at least {format_bytes(needed - free)}" if free is not None and needed > free else "space"
    return DiskFullError(
        f"no space left on the disk: checkpoint {folder} needs about {format_bytes(needed)} and {have} in "
        f"{folder.parent} (writing {error.path.name} failed). Its temporary folder {staging.name} was removed; the "
        f"earlier checkpoints and weight files are intact. Free {amount} there (a lower "
        "--checkpoints_total_limit keeps fewer checkpoints) or choose an --output_path on a larger disk, then rerun "
        "the command with --resume_from_checkpoint latest to continue from the newest checkpoint",
        folder, needed, free)


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
    for name in ("trainable.safetensors", "state.safetensors", EMA_FILE):
        if name == EMA_FILE and not (folder / name).exists():
            continue  # a run without --ema_decay
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
    """Reads ``(trainable, optimizer_state, scheduler_state, progress)`` from a checkpoint folder, on the CPU; a
    checkpoint with an EMA (``--ema_decay``) adds its weights to ``progress`` under ``ema``.

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
        if (folder / EMA_FILE).exists():
            progress["ema"] = load_file(str(folder / EMA_FILE))
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
        # The adapter's type fixes the names of its weights; a checkpoint recorded before these flags passes.
        "lora_type": run.lora.lora_type if lora else None,
        "use_dora": run.lora.use_dora if lora else None,
        "lokr_factor": run.lora.lokr_factor if lora and run.lora.lora_type == "lokr" else None,
        "trainable_models": sorted(run.training.trainable),
        # The optimizer state in the checkpoint is the named class's (AdamW's when unset).
        "customized_optimizer": run.training.customized_optimizer,
        # A checkpoint holds an EMA only when its run kept one, of this decay.
        "ema_decay": run.training.ema_decay,
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


def nothing_left_message(folder: str | os.PathLike, step: int, reason: str, fix: str) -> str:
    """The refusal of a resume that would train nothing: ``reason`` says why the checkpoint at optimizer step
    ``step`` is the end of the run, ``fix`` which flag to raise to train on from it."""
    return (f"--resume_from_checkpoint: the checkpoint {folder} (optimizer step {step}) is the end of the run: "
            f"{reason}, so resuming it would train nothing; nothing was trained or written. The run's weights files "
            f"are in its --output_path. To train on from this checkpoint, {fix}; to train anew, drop "
            "--resume_from_checkpoint and choose another --output_path or add --overwrite_output")


def nothing_left_problem(folder: str | os.PathLike, progress: Mapping[str, Any], num_epochs: int,
                         max_train_steps: int | None) -> str | None:
    """Why resuming ``folder`` would train nothing, judged from its position alone (before anything loads), or None.

    A checkpoint whose run did all ``--num_epochs`` epochs, or ``--max_train_steps`` steps, leaves no step; a
    resume must not then exit as if it had trained. (A dataset that shrank since can also leave no step: the
    training loop checks its schedule once it is built.)
    """
    step, epoch = int(progress["global_step"]), int(progress["epoch"])
    if epoch >= num_epochs:
        return nothing_left_message(folder, step, f"all {epoch} epoch(s) are done and this run asks for "
                                    f"--num_epochs {num_epochs}", "raise --num_epochs")
    if max_train_steps is not None and step >= max_train_steps:
        return nothing_left_message(folder, step, f"this run asks for --max_train_steps {max_train_steps}",
                                    "raise --max_train_steps")
    return None


def _flag_text(value: Any) -> str:
    if value is None or value == []:
        return "(unset)"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return f"{value:g}" if isinstance(value, float) else str(value)
