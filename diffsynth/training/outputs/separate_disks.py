"""Machines that each see their own ``--output_path`` (local disks) rather than one shared folder (NFS and the like).

Only the main process writes a run's outputs (LoRA files, checkpoints, logs, the run record), so a run over several
machines needs no shared folder to train: the other machines write nothing there. Two things read the folder back:

- **A resume** reads the checkpoint on every process. Each process checks whether its ``--output_path`` is the
  main process's folder: it is when it holds the lock the main process just took (same run id, process and host).
  When every process sees it, each reads the checkpoint itself; otherwise the main process reads it and sends it to
  all (:func:`training_state_for_every_process`), so a checkpoint on machine 0's disk resumes on every machine.
- **Stage 1** writes one cache into which every process puts its share of the samples, and stage 2 reads all of
  them on every machine. On separate disks each disk would hold a part: stage 1 across machines is refused before
  any work unless every process sees the main process's folder (:func:`stage_one_problem`). Run it on a shared
  folder, or on one machine, and copy the finished cache to every machine for stage 2.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any

from ...core.folder_lock import LockHolder, read_lock

logger = logging.getLogger(__name__)


def sees_main_folder(folder: str | Path, main_holder: dict[str, Any] | None, attempts: int = 3) -> bool:
    """Whether ``folder`` is the main process's output folder: its lock names the holder the main process wrote.

    A network file system may answer from a cache that predates the lock (an NFS client caches a name it did not
    find for up to a minute): the folder is listed before each look, which makes the client ask the server again,
    and a lock not seen is looked for ``attempts`` times, a second apart."""
    if main_holder is None:
        return False
    expected = (main_holder["run_id"], main_holder["pid"], main_holder["host"])
    for attempt in range(attempts):
        if attempt:
            time.sleep(1.0)
        with contextlib.suppress(OSError):
            os.listdir(folder)
        found = read_lock(folder)
        holder = found[0] if found else None
        if holder is not None and (holder.run_id, holder.pid, holder.host) == expected:
            return True
    return False


def holder_record(holder: LockHolder | None) -> dict[str, Any] | None:
    """What :func:`sees_main_folder` compares, to send to the other processes."""
    return None if holder is None else {"run_id": holder.run_id, "pid": holder.pid, "host": holder.host}


def stage_one_problem(task: str, folder: str | Path, blind_ranks: list[int]) -> str:
    """The refusal of a stage 1 whose processes ``blind_ranks`` do not see the main process's ``folder``."""
    ranks = ", ".join(str(rank) for rank in blind_ranks)
    return (f"--task {task} across machines writes one cache that every process fills with its share, but "
            f"process(es) {ranks} do not see the main process's --output_path {folder} (theirs is on another disk): "
            "put --output_path on a file system every machine mounts (NFS or the like), or run stage 1 on one "
            "machine (--num_machines 1) and copy the finished cache to every machine for stage 2")


def training_state_for_every_process(checkpoint: Path, accelerator: Any, shared: bool) -> tuple:
    """``load_training_state(checkpoint)`` in every process: read by each itself when the output folder is ``shared``
    by all, else read by the main process and sent to the others (a collective then: every process calls it).

    Raises:
        CheckpointError: The checkpoint cannot be read (raised in every process, with the main process's message).
    """
    from .checkpoint import CheckpointError, load_training_state

    if shared or accelerator.num_processes == 1:
        return load_training_state(checkpoint)
    from accelerate.utils import broadcast_object_list

    sent: list[Any] = [None]
    if accelerator.is_main_process:
        try:
            sent = [load_training_state(checkpoint)]
        except CheckpointError as error:
            sent = [error]
    broadcast_object_list(sent)
    if isinstance(sent[0], CheckpointError):
        raise sent[0]
    if not accelerator.is_main_process:
        logger.info("resuming from the main process's %s, sent over the process group (this process's "
                    "--output_path is not the main process's folder)", checkpoint)
    return sent[0]
