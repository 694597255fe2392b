"""Naming the process a run lost, and the bound on how long a process waits for the others.

When a process of a multi-process run dies (``kill -9``, the OOM killer, a machine that goes down), the others learn
it from the communication library at their next collective: gloo or NCCL raises an error that names a socket, not a
process. To name the lost one, every process increments its own counter in the launch's rendezvous store (the
``torchrun`` agent's TCP store at ``MASTER_ADDR:MASTER_PORT``, on the main machine) once a second from a daemon
thread. A process whose collective fails reads the counters twice, a few seconds apart: the ranks whose counter
stood still are gone; a store that cannot be reached means the main machine itself is gone. It then prints one line
naming them (:func:`lost_process_line`) in place of the communication library's traceback.

A process that hangs rather than dies keeps the others waiting in their next collective until torch.distributed's
timeout: 30 minutes for gloo by default (10 for NCCL). ``DIFFSYNTH_PROCESS_TIMEOUT`` (seconds) sets it for the
run's process group; :func:`process_group_timeout` reads it for the accelerator.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from ..config.errors import FlagError

if TYPE_CHECKING:
    from .agreement import ProcessIdentity

PROCESS_TIMEOUT_ENV = "DIFFSYNTH_PROCESS_TIMEOUT"
HEARTBEAT_SECONDS = 1.0
# Long enough for a live process's counter to move at least twice.
SILENCE_SECONDS = 3.5
_KEY = "diffsynth/alive/{}"
# What gloo's and NCCL's errors say when a peer is gone or a collective timed out.
_COMMUNICATION_MARKERS = ("gloo", "NCCL", "Connection reset by peer", "Connection closed by peer", "Broken pipe",
                          "Timed out", "timed out", "ProcessGroup")
RESUME_HINT = ("restart the command on every machine with --resume_from_checkpoint latest to continue from the last "
               "checkpoint")


def process_group_timeout() -> timedelta | None:
    """The process-group timeout ``DIFFSYNTH_PROCESS_TIMEOUT`` asks for, or None (torch's default).

    Raises:
        FlagError: The value is not a positive number of seconds.
    """
    value = os.environ.get(PROCESS_TIMEOUT_ENV, "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise FlagError([f"{PROCESS_TIMEOUT_ENV}={value} must be a number of seconds above 0, the longest a process "
                         f"waits for the others in one collective; e.g. {PROCESS_TIMEOUT_ENV}=600, or unset it for "
                         "torch's default (30 min)"])
    return timedelta(seconds=seconds)


def _store(timeout: float) -> Any:
    import torch.distributed as dist

    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=timedelta(seconds=timeout), wait_for_workers=False)


class ProcessWatch:
    """This process's heartbeat in the rendezvous store and the identities of the run's processes."""

    current: ClassVar[ProcessWatch | None] = None

    def __init__(self, identities: list[ProcessIdentity], rank: int):
        self.identities, self.rank = identities, rank
        self._stopped = threading.Event()
        self._store = _store(timeout=10.0)
        self._thread = threading.Thread(target=self._beat, name="diffsynth-heartbeat", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, identities: list[ProcessIdentity], rank: int) -> ProcessWatch | None:
        """Starts this process's heartbeat (replacing an earlier one); None for a single process, or a launch
        without a rendezvous store (no ``MASTER_ADDR``)."""
        if cls.current is not None:
            cls.current.stop()
            cls.current = None
        if len(identities) > 1 and "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
            cls.current = cls(identities, rank)
        return cls.current

    def _beat(self) -> None:
        key = _KEY.format(self.rank)
        while True:
            try:
                self._store.add(key, 1)
            except Exception:  # noqa: BLE001 - the store is gone with the main machine: nothing left to tell
                return
            if self._stopped.wait(HEARTBEAT_SECONDS):
                return

    def stop(self) -> None:
        self._stopped.set()

    def silent_ranks(self, wait: float = SILENCE_SECONDS) -> list[int] | None:
        """The other ranks whose heartbeat stood still for ``wait`` seconds; None if the store cannot be reached."""
        try:
            store = _store(timeout=5.0)
            ranks = [one.rank for one in self.identities if one.rank != self.rank]
            before = [store.add(_KEY.format(rank), 0) for rank in ranks]
            time.sleep(wait)
            after = [store.add(_KEY.format(rank), 0) for rank in ranks]
        except Exception:  # noqa: BLE001 - any failure to reach the store means its machine is gone
            return None
        return [rank for rank, first, second in zip(ranks, before, after) if first == second]


def is_communication_error(error: BaseException) -> bool:
    """Whether ``error`` (or one it was raised from) is torch.distributed's or its backend's about a peer."""
    import torch.distributed as dist

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, dist.DistError) or (isinstance(seen, RuntimeError)
                                                and any(marker in str(seen) for marker in _COMMUNICATION_MARKERS)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def lost_process_line(error: BaseException) -> str | None:
    """The one line that says which process a run lost, for an ``error`` of the communication library in a watched
    run; None for any other error (or an unwatched run)."""
    watch = ProcessWatch.current
    if watch is None or not is_communication_error(error):
        return None
    watch.stop()
    ids = {one.rank: one for one in watch.identities}
    me = ids[watch.rank].where()
    silent = watch.silent_ranks()
    if silent is None:
        return (f"[{me}] lost the main machine: the main process {ids[0].where()} and its rendezvous at "
                f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} cannot be reached (killed, crashed, "
                f"or the machine or network went down; its own log says why); this process stops too; {RESUME_HINT}")
    if silent:
        lost = ", ".join(ids[rank].where() for rank in silent)
        return (f"[{me}] lost {lost}: it stopped responding (killed, crashed, hung, or its machine went down; its own "
                f"log says why), so this process stops too; {RESUME_HINT}")
    return (f"[{me}] a collective failed or timed out ({str(error).splitlines()[0][:200]}) while every process was "
            f"still alive: one of them hangs or waits elsewhere; {PROCESS_TIMEOUT_ENV} bounds how long the others "
            f"wait (seconds; torch's default is 30 min); {RESUME_HINT}")
