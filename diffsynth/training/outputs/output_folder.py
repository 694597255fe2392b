"""Who owns an ``--output_path``: one live run at a time, one run's outputs, checked before any model loads.

At start-up the main process claims the folder (:func:`claim_output_folder`):

1. ``--resume_from_checkpoint`` is resolved (``latest`` falls back past unreadable checkpoints) and the flags the
   checkpoint recorded are compared with this run's;
2. the folder is created and locked (``core.folder_lock``); creating the lock file is the writability check;
3. files an earlier run wrote there (:func:`previous_outputs`) refuse a new run, unless it resumes or
   ``--overwrite_output`` removes them first. A stage-1 (``*:data_process``) run continues the cache already there:
   that is how an interrupted stage 1 resumes.

The verdict, with the run id and the checkpoint, is broadcast to every process, so the other processes of the
launch learn it at the same point and all stop, or all go on, before loading anything; only the main process holds
the lock, so a launch never refuses itself. The run id is new for a new run and the checkpoint's for a resumed one.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...core.data.cache import CACHE_INFO_FILE, CACHE_MANIFEST_FILE
from ...core.files import missing_folders, remove_empty_folders
from ...core.folder_lock import STALE_AFTER_SECONDS, FolderLock, FolderLockedError
from ...core.loader import model_base_path
from ..errors import FlagError
from .checkpoint import CHECKPOINTS_DIR, flag_mismatches, read_progress, resolve_checkpoint, training_flags
from .logger import DIFFUSERS_TWIN_SUFFIX, METRICS_FILE, SAMPLES_DIR, TENSORBOARD_DIR, TRAINING_ARGS_FILE
from .loss_chart import LOSS_CHART_FILE

if TYPE_CHECKING:
    from ..config import RunConfig
    from ..objective.training_module import TargetAliases

logger = logging.getLogger(__name__)

# A LoRA file's name without its extension: the diffusers twin (logger.DIFFUSERS_TWIN_SUFFIX) is the run's too.
_LORA_FILE = rf"(epoch|step)-\d+({re.escape(DIFFUSERS_TWIN_SUFFIX)})?"
#: The flags a training run resolved, which ``--config`` reruns (``config.files.save_run_config``).
RUN_CONFIG_FILE = "config.yaml"
# Files and folders a training run writes: a regular expression for the sub-folder ("" for the output folder itself)
# mapped to regular expressions for the names in it. Names starting with "." are what core.files.atomic_write leaves
# behind when a run is killed mid-write.
TRAINING_OUTPUTS: dict[str, tuple[str, ...]] = {
    "": (rf"{_LORA_FILE}\.safetensors", rf"\.{_LORA_FILE}\.safetensors\..+\.tmp",
         *(pattern for name in (TRAINING_ARGS_FILE, RUN_CONFIG_FILE)
           for pattern in (re.escape(name), rf"\.{re.escape(name)}\..+\.tmp"))),
    re.escape(CHECKPOINTS_DIR): (r"step-\d+", r"\.step-\d+\.tmp"),
    re.escape(SAMPLES_DIR): (r"step-\d+",),
    re.escape(str(METRICS_FILE.parent)): tuple(
        pattern for name in (METRICS_FILE.name, LOSS_CHART_FILE.name)
        for pattern in (re.escape(name), rf"\.{re.escape(name)}\..+\.tmp")) + (re.escape(TENSORBOARD_DIR.name),),
}
# A stage-1 cache: its info file and <process index>/<sample index>.safetensors.
STAGE_ONE_OUTPUTS: dict[str, tuple[str, ...]] = {
    "": tuple(pattern for name in (CACHE_INFO_FILE, CACHE_MANIFEST_FILE)
               for pattern in (re.escape(name), rf"\.{re.escape(name)}\..+\.tmp")),
    r"\d+": (r"\d+\.safetensors", r"\.\d+\.safetensors\..+\.tmp"),
}


@dataclass
class OutputClaim:
    """The run's hold on its output folder.

    Attributes:
        run_id: This run's id (a resumed run keeps the id of the run it continues).
        checkpoint: The checkpoint to resume from, or None.
        progress: That checkpoint's ``progress.json``, or None.
        lock: The folder lock (main process only).
        created: The folders this claim created, the output folder and its new parents, deepest first (main
            process only).
    """

    run_id: str
    checkpoint: Path | None = None
    progress: dict[str, Any] | None = None
    lock: FolderLock | None = None
    created: list[Path] = field(default_factory=list)

    def release(self) -> None:
        """Releases the lock, and removes the folders this run created if it wrote nothing there (it failed early)."""
        if self.lock is None:
            return
        self.lock.release()
        remove_empty_folders(self.created)


def previous_outputs(folder: str | os.PathLike, outputs: Mapping[str, tuple[str, ...]]) -> list[Path]:
    """The files and folders under ``folder`` whose names match ``outputs`` (e.g. :data:`TRAINING_OUTPUTS`)."""
    folder = Path(folder)
    found = []
    for parent_pattern, names in outputs.items():
        parents = [folder] if not parent_pattern else [
            path for path in _children(folder) if path.is_dir() and re.fullmatch(parent_pattern, path.name)]
        for parent in parents:
            found += [path for path in _children(parent) if any(re.fullmatch(name, path.name) for name in names)]
    return sorted(found)


def _children(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def remove_outputs(folder: str | os.PathLike, paths: list[Path]) -> None:
    """Deletes ``paths`` (from :func:`previous_outputs`), then the sub-folders of ``folder`` left empty by it."""
    parents = {path.parent for path in paths} - {Path(folder)}
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    for parent in parents:
        if parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()


def _listing(folder: Path, paths: list[Path], limit: int = 6) -> str:
    names = [str(path.relative_to(folder)) for path in paths]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _previous_run_id(folder: Path) -> str | None:
    try:
        return json.loads((folder / TRAINING_ARGS_FILE).read_text(encoding="utf-8")).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None


def _is_model_folder(folder: Path) -> bool:
    try:
        return folder.resolve() == model_base_path().resolve()
    except OSError:
        return False


def _busy_problem(folder: Path, error: FolderLockedError) -> str:
    who = error.holder.describe() if error.holder is not None else "a process whose lock file cannot be read"
    return (f"--output_path {folder} is in use by {who} (last heartbeat {error.heartbeat_age:.0f} s ago). Two runs "
            f"must not write into one folder: wait for that run to end, or choose another --output_path. If that "
            f"process is gone for good (e.g. its machine was lost), delete {error.lock_path}; a lock whose process "
            f"has ended on this host, or whose heartbeat is older than {STALE_AFTER_SECONDS / 60:.0f} min, is taken "
            "over automatically")


def _ownership_problems(run: RunConfig, folder: Path, stage: str | None) -> list[str]:
    """Refuses, or with ``--overwrite_output`` removes, what an earlier run left in ``folder``."""
    outputs = STAGE_ONE_OUTPUTS if stage == "data_process" else TRAINING_OUTPUTS
    previous = previous_outputs(folder, outputs)
    if not previous:
        return []
    if run.output.overwrite_output:
        logger.warning("--overwrite_output: removing %d outputs of the earlier run in %s: %s", len(previous), folder,
                       _listing(folder, previous))
        remove_outputs(folder, previous)
        return []
    if stage == "data_process" or run.training.resume_checkpoint:
        return []  # stage 1 continues its cache; a resumed run continues the outputs it finds
    run = _previous_run_id(folder)
    run = f" (run {run})" if run else ""
    resume = ("continue that run with --resume_from_checkpoint latest, "
              if (folder / CHECKPOINTS_DIR).is_dir() else "")
    return [f"--output_path {folder} holds the outputs of an earlier run{run}: {_listing(folder, previous)}; "
            f"{resume}replace them with --overwrite_output (it removes only the files the trainer writes, listed "
            "here), or choose another --output_path"]


def _writable_problems(folder: Path) -> list[str]:
    """Sub-folders the run writes into that exist but are read-only (the folder itself was written by the lock)."""
    blocked = [sub for sub in (folder / CHECKPOINTS_DIR, folder / METRICS_FILE.parent)
               if sub.is_dir() and not os.access(sub, os.W_OK | os.X_OK)]
    return [f"--output_path {folder}: {sub} is not writable; fix its permissions (e.g. chmod -R u+w {sub}) or choose "
            "another --output_path" for sub in blocked]


def _claim(run: RunConfig, target_aliases: TargetAliases, num_processes: int) -> OutputClaim:
    """The main process's half of :func:`claim_output_folder`: checks, lock, ownership. Raises ``FlagError``."""
    folder = Path(run.output.output_path)
    stage = run.training.stage
    problems = []
    if _is_model_folder(folder):
        raise FlagError([f"--output_path {folder} is the model folder (DIFFSYNTH_MODEL_BASE_PATH); training outputs "
                         "do not belong among the model files: pass another --output_path, e.g. ./output"])
    checkpoint = progress = None
    if run.training.resume_checkpoint:
        checkpoint = resolve_checkpoint(run.training.resume_checkpoint, folder)
        progress = read_progress(checkpoint)
        problems += flag_mismatches(checkpoint, progress.get("flags"),
                                    training_flags(run, target_aliases, num_processes))
    run_id = (progress or {}).get("run_id") or uuid.uuid4().hex[:12]
    lock = FolderLock(folder, purpose=f"--task {run.training.task}", run_id=run_id)
    claim = OutputClaim(run_id, checkpoint, progress, lock, created=missing_folders(folder))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        claim.lock.acquire()
    except FolderLockedError as error:
        raise FlagError([*problems, _busy_problem(folder, error)]) from error
    except OSError as error:
        remove_empty_folders(claim.created)
        raise FlagError([*problems, f"--output_path {folder} is not writable ({type(error).__name__}: {error}); "
                                    "choose a folder you can write to, or fix its permissions (e.g. chmod u+w "
                                    f"{folder})"]) from error
    try:
        problems += _writable_problems(folder)
        if not problems:  # --overwrite_output deletes nothing while another problem stops the run anyway
            problems += _ownership_problems(run, folder, stage)
        if problems:
            raise FlagError(problems)
    except BaseException:
        claim.release()
        raise
    return claim


def claim_output_folder(run: RunConfig, accelerator: Any, target_aliases: TargetAliases
                        ) -> OutputClaim:
    """Claims ``--output_path`` for this run on the main process and shares the verdict with every process.

    Call it on every process, before anything heavy: it is a collective operation when several processes run.

    Args:
        run: The run's config.
        accelerator: The run's ``accelerate.Accelerator``.
        target_aliases: The pipeline's LoRA target aliases (to compare ``--lora_target_modules`` with a checkpoint's).

    Raises:
        FlagError: The folder is in use, not writable, the model folder, or holds another run's outputs; or the
            checkpoint was trained with other flags. Every process raises (the others with the main's message).
        FileNotFoundError, CheckpointError: ``--resume_from_checkpoint`` names no readable checkpoint.
    """
    claim = verdict = failure = None
    if accelerator.is_main_process:
        try:
            claim = _claim(run, target_aliases, accelerator.num_processes)
            verdict = {"run_id": claim.run_id, "checkpoint": claim.checkpoint, "progress": claim.progress}
        except Exception as error:  # noqa: BLE001 - whatever stops the main process must reach the others
            failure, verdict = error, {"refused": str(error)}
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        shared = [verdict]
        broadcast_object_list(shared)
        verdict = shared[0]
    if failure is not None:
        raise failure
    if "refused" in verdict:
        raise FlagError([f"the main process refused to start: {verdict['refused']}"])
    return claim or OutputClaim(verdict["run_id"], verdict["checkpoint"], verdict["progress"])
