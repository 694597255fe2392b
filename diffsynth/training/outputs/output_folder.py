"""Who owns an ``--output_path``: one live run at a time, one run's outputs, checked before any model loads.

At start-up the main process claims the folder (:func:`claim_output_folder`):

1. ``--resume_from_checkpoint`` is resolved (``latest`` falls back past unreadable checkpoints) and the flags the
   checkpoint recorded are compared with this run's;
2. the folder is created and locked (``core.folder_lock``); creating the lock file is the writability check;
3. files an earlier run wrote there (:mod:`.earlier_outputs`) refuse a new run, unless it resumes or
   ``--overwrite_output`` removes them first: the files the trainer recorded writing, nothing else. A stage-1
   (``*:data_process``) run continues the cache already there: that is how an interrupted stage 1 resumes.
4. from then on, every process records the files it writes there (``core.written_files``), for the next
   ``--overwrite_output``.

The verdict, with the run id and the checkpoint, is broadcast to every process, so the other processes of the
launch learn it at the same point and all stop, or all go on, before loading anything; only the main process holds
the lock, so a launch never refuses itself. Each process then tells whether its folder is the main process's (it sees
the lock): machines with disks of their own train and resume, but refuse a stage 1 (:mod:`.separate_disks`). The run
id is new for a new run and the checkpoint's for a resumed one.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...core.files import missing_folders, remove_empty_folders
from ...core.folder_lock import STALE_AFTER_SECONDS, FolderLock, FolderLockedError, read_lock
from ...core.loader import model_base_path
from ...core.written_files import WrittenFiles, start_recording
from ..config.errors import FlagError
from ..config.files import RUN_CONFIG_FILE
from .checkpoint import (
    CHECKPOINTS_DIR,
    CheckpointNotFoundError,
    flag_mismatches,
    nothing_left_problem,
    read_progress,
    resolve_checkpoint,
    training_flags,
)
from .earlier_outputs import (
    STAGE_ONE_OUTPUTS,
    TRAINING_OUTPUTS,
    EarlierOutputs,
    earlier_outputs,
    listing,
    previous_outputs,
    remove_outputs,
)
from .logger import METRICS_FILE, TRAINING_ARGS_FILE
from .separate_disks import holder_record, sees_main_folder, stage_one_problem

__all__ = [
    "RUN_CONFIG_FILE",
    "STAGE_ONE_OUTPUTS",
    "TRAINING_OUTPUTS",
    "OutputClaim",
    "claim_output_folder",
    "previous_outputs",
]  # the names tables and RUN_CONFIG_FILE stay importable from here

if TYPE_CHECKING:
    from ..config import RunConfig
    from ..objective.lora_targets import TargetAliases

logger = logging.getLogger(__name__)

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
        recording: This process's record of the files it writes into the folder.
        shared: Whether every process sees the main process's folder (False: some machine has a disk of its own;
            :mod:`.separate_disks`).
    """

    run_id: str
    checkpoint: Path | None = None
    progress: dict[str, Any] | None = None
    lock: FolderLock | None = None
    created: list[Path] = field(default_factory=list)
    recording: WrittenFiles | None = None
    shared: bool = True

    def release(self) -> None:
        """Ends the recording, releases the lock, and removes the folders this run created if it wrote nothing there
        (it failed early)."""
        if self.recording is not None:
            self.recording.stop()
        if self.lock is None:
            return
        self.lock.release()
        remove_empty_folders(self.created)


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
            f"has ended on this host (same host name, boot and container), or whose heartbeat is older than "
            f"{STALE_AFTER_SECONDS / 60:.0f} min, is taken over automatically")


def _ownership_problems(run: RunConfig, folder: Path, stage: str | None, run_id: str) -> list[str]:
    """Refuses, or with ``--overwrite_output`` removes, what an earlier run left in ``folder``; a run that continues
    the outputs of a version that kept no record (``run_id``) records those that carry the trainer's marks."""
    stage_one = stage == "data_process"
    earlier = earlier_outputs(folder, STAGE_ONE_OUTPUTS if stage_one else TRAINING_OUTPUTS)
    if not earlier.ours and not earlier.others:
        return []
    in_the_way = earlier.in_the_way(stage_one)
    if run.output.overwrite_output:
        if in_the_way:  # refused before anything is removed, so that the fix is one step
            names = _names(folder, in_the_way)
            return [(f"--overwrite_output: {folder} holds {names}, which a new run writes over or appends to, but "
                     f"{_not_ours(earlier)}: move them away or delete them (e.g. cd {folder} && rm {names}), then "
                     "rerun; nothing was removed")]
        if earlier.ours:
            logger.warning("--overwrite_output: removing the %d files that earlier runs of the trainer wrote in %s: "
                           "%s", len(earlier.ours), folder, listing(folder, earlier.ours))
        remove_outputs(folder, earlier.ours)
        if earlier.others:
            logger.warning("--overwrite_output: keeping %d files in %s that have the names of trainer outputs but "
                           "that the trainer did not write (or that were changed since): %s; a file of the same name "
                           "that this run writes replaces one", len(earlier.others), folder,
                           listing(folder, earlier.others))
        return []
    if stage_one or run.training.resume_checkpoint:  # stage 1 continues its cache; a resume the outputs it finds
        if earlier.ours and not earlier.recorded:
            adopted = WrittenFiles(folder, run_id)
            for path in earlier.ours:
                adopted.record(path)
            adopted.stop()
        return []
    resume = ("continue that run with --resume_from_checkpoint latest, "
              if earlier.ours and (folder / CHECKPOINTS_DIR).is_dir() else "")
    return [(f"--output_path {folder} {_found(folder, earlier)}; {resume}start afresh with --overwrite_output, "
             f"{_what_overwrite_does(folder, earlier, in_the_way)}, or choose another --output_path")]


def _files(count: int) -> str:
    return f"{count} file{'s' if count != 1 else ''}"


def _names(folder: Path, paths: list[Path]) -> str:
    return " ".join(path.relative_to(folder).as_posix() for path in paths)


def _found(folder: Path, earlier: EarlierOutputs) -> str:
    """What the folder holds, for a refusal: the trainer's files first, capped, with their number."""
    if not earlier.ours:
        return f"holds files with the names of trainer outputs: {_files(len(earlier.others))}, " \
               f"{listing(folder, earlier.others)}"
    run_id = _previous_run_id(folder)
    return (f"holds the outputs of an earlier run{f' (run {run_id})' if run_id else ''}: "
            f"{_files(len(earlier.ours))}, {listing(folder, earlier.ours)}")


def _not_ours(earlier: EarlierOutputs) -> str:
    if earlier.recorded:
        return "the trainer did not write them, or they were changed since"
    return "this folder has no record of the trainer's files (an older diffsynth kept none) and they carry no mark of it"


def _what_overwrite_does(folder: Path, earlier: EarlierOutputs, in_the_way: list[Path]) -> str:
    """What ``--overwrite_output`` would remove and keep here, and what to move by hand first."""
    if earlier.ours:
        said = "which removes those files only"
        if earlier.others:
            said += (f" and keeps {_files(len(earlier.others))} with the names of trainer outputs that the trainer "
                     f"did not write or that were changed since ({listing(folder, earlier.others)})")
    else:
        said = ("which keeps them (the trainer did not write them, or they were changed since; a file of the same "
                "name that the run writes replaces one)")
    if in_the_way:
        names = _names(folder, in_the_way)
        said += (f", once you move away or delete {names} (e.g. cd {folder} && rm {names}): a new run writes over or "
                 f"appends to them, but {_not_ours(earlier)}")
    return said


def _nothing_to_resume(run: RunConfig, folder: Path, stage: str | None) -> CheckpointNotFoundError | None:
    """``--resume_from_checkpoint latest`` found no checkpoint, but earlier outputs that would refuse a fresh start:
    the error that says the whole fix, or None where dropping the flag is enough."""
    earlier = earlier_outputs(folder, TRAINING_OUTPUTS)
    if run.training.resume_checkpoint != "latest" or stage == "data_process" or not (earlier.ours or earlier.others):
        return None
    return CheckpointNotFoundError(
        f"--resume_from_checkpoint latest: there is no checkpoint under {folder / CHECKPOINTS_DIR} to resume, and "
        f"--output_path {folder} {_found(folder, earlier)}; to start afresh there, drop --resume_from_checkpoint and "
        f"add --overwrite_output, {_what_overwrite_does(folder, earlier, earlier.in_the_way(stage_one=False))}; or "
        "choose another --output_path")


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
        raise FlagError([(f"--output_path {folder} is the model folder (DIFFSYNTH_MODEL_BASE_PATH); training "
                          "outputs do not belong among the model files: pass another --output_path, e.g. ./output")])
    checkpoint = progress = None
    if run.training.resume_checkpoint:
        try:
            checkpoint = resolve_checkpoint(run.training.resume_checkpoint, folder)
        except CheckpointNotFoundError as error:
            raise _nothing_to_resume(run, folder, stage) or error from error
        progress = read_progress(checkpoint)
        problems += flag_mismatches(checkpoint, progress.get("flags"),
                                    training_flags(run, target_aliases, num_processes))
        finished = nothing_left_problem(checkpoint, progress, run.training.num_epochs, run.training.max_train_steps)
        problems += [finished] if finished and stage != "data_process" else []
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
        raise FlagError([*problems, (f"--output_path {folder} is not writable ({type(error).__name__}: {error}); "
                                     "choose a folder you can write to, or fix its permissions (e.g. chmod u+w "
                                     f"{folder})")]) from error
    try:
        problems += _writable_problems(folder)
        if not problems:  # --overwrite_output deletes nothing while another problem stops the run anyway
            problems += _ownership_problems(run, folder, stage, run_id)
        if problems:
            raise FlagError(problems)
    except BaseException:
        claim.release()
        raise
    return claim


def _find_separate_disks(claim: OutputClaim, run: RunConfig, accelerator: Any, verdict: dict[str, Any]) -> None:
    """Sets ``claim.shared`` from every process's view of the main process's folder; refuses a stage 1 that some
    process would write to another disk (a collective: every process calls it)."""
    from accelerate.utils import gather_object

    sees = accelerator.is_main_process or sees_main_folder(run.output.output_path, verdict["holder"])
    blind = [rank for rank, seen in enumerate(gather_object([sees])) if not seen]
    claim.shared = not blind
    if blind and run.training.stage == "data_process":
        claim.release()
        raise FlagError([stage_one_problem(run.training.task, verdict["folder"], blind)])


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
            verdict = {"run_id": claim.run_id, "checkpoint": claim.checkpoint, "progress": claim.progress,
                       "holder": holder_record((read_lock(run.output.output_path) or (None,))[0]),
                       "folder": run.output.output_path}
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
    claim = claim or OutputClaim(verdict["run_id"], verdict["checkpoint"], verdict["progress"])
    if accelerator.num_processes > 1:
        _find_separate_disks(claim, run, accelerator, verdict)
    claim.recording = start_recording(run.output.output_path, claim.run_id)
    return claim
