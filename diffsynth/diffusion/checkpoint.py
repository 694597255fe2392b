"""Training-state checkpoints for ``--resume_from_checkpoint``: weights, optimizer, schedule and data position.

A checkpoint is a folder ``<output_path>/checkpoints/step-<N>/`` holding

- ``trainable.safetensors``: the trainable weights, named as in the training module (``pipe.dit....``);
- ``state.safetensors``: the optimizer and learning-rate scheduler states (tensors by path, structure as JSON in the
  metadata; no pickle);
- ``progress.json``: optimizer step, micro-batch count, epoch, batches consumed in that epoch, and the seed.

The folder is written under a temporary name and renamed when complete, so a run killed while saving leaves the
previous checkpoint as the latest. Random draws need no saved generator state: the sampler and the loss's per-step
generator are seeded from the run's seed, the epoch and the step.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..core.data.cache_codec import decode_tree, encode_tree
from ..core.files import atomic_save_safetensors, atomic_write_json
from ..core.finite import require_finite

CHECKPOINTS_DIR = "checkpoints"
_PREFIX = "step-"


def checkpoint_folder(output_path: str | os.PathLike, step: int) -> Path:
    """``<output_path>/checkpoints/step-<step>``."""
    return Path(output_path) / CHECKPOINTS_DIR / f"{_PREFIX}{step}"


def save_training_state(output_path: str | os.PathLike, trainable: Mapping[str, torch.Tensor],
                        optimizer_state: Mapping[str, Any], scheduler_state: Mapping[str, Any],
                        progress: Mapping[str, Any], keep_last: int | None = None) -> Path:
    """Writes one checkpoint folder for ``progress["global_step"]``, replacing one of the same step.

    Args:
        keep_last: Delete all but this many newest checkpoints afterwards (``--checkpoints_total_limit``); None
            keeps all. A full fine-tune's checkpoint holds the weights and two optimizer moments, so keeping every
            one fills a disk quickly.

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
        for _, old in sorted(_complete_checkpoints(output_path))[:-keep_last]:
            shutil.rmtree(old)
    return folder


def _complete_checkpoints(output_path: str | os.PathLike) -> list[tuple[int, Path]]:
    root = Path(output_path) / CHECKPOINTS_DIR
    return [(int(path.name[len(_PREFIX):]), path) for path in root.glob(f"{_PREFIX}*")
            if path.name[len(_PREFIX):].isdigit() and (path / "progress.json").is_file()]


def latest_checkpoint(output_path: str | os.PathLike) -> Path | None:
    """The complete checkpoint with the highest step under ``output_path``, or None."""
    steps = _complete_checkpoints(output_path)
    return max(steps)[1] if steps else None


def resolve_checkpoint(value: str, output_path: str | os.PathLike) -> Path:
    """Turns ``--resume_from_checkpoint`` (a folder, or ``latest``) into a checkpoint folder.

    Raises:
        FileNotFoundError: No such checkpoint; the message names the flag, the value and where it looked.
    """
    folder = latest_checkpoint(output_path) if value == "latest" else Path(value)
    if folder is None or not (folder / "progress.json").is_file():
        where = Path(output_path) / CHECKPOINTS_DIR if value == "latest" else folder
        raise FileNotFoundError(f"--resume_from_checkpoint {value}: no checkpoint at {where}; pass a "
                                f"{CHECKPOINTS_DIR}/{_PREFIX}<N> folder written by an earlier run with the same "
                                "--output_path, or drop the flag to start afresh")
    return folder


def read_progress(folder: str | os.PathLike) -> dict[str, Any]:
    """The ``progress.json`` of a checkpoint folder."""
    return json.loads((Path(folder) / "progress.json").read_text())


def load_training_state(folder: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict, dict, dict]:
    """Reads ``(trainable, optimizer_state, scheduler_state, progress)`` from a checkpoint folder, on the CPU."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    folder = Path(folder)
    trainable = load_file(str(folder / "trainable.safetensors"))
    with safe_open(str(folder / "state.safetensors"), framework="pt", device="cpu") as handle:
        structure = json.loads(handle.metadata()["structure"])
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 - not a dict
    state = decode_tree(tensors, structure)
    return trainable, state["optimizer"], state["lr_scheduler"], read_progress(folder)
