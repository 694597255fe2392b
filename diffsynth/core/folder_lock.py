"""One process at a time per folder: a lock file naming its holder, with stale-lock takeover and a heartbeat.

The lock is ``<folder>/.diffsynth.lock``, a JSON record of the holder: ``run_id``, ``pid``, ``host``, ``pid_start``
(the process's start time in clock ticks since boot, read from ``/proc`` on Linux, else null), ``started`` (UTC,
ISO 8601), ``purpose`` (e.g. ``--task sft:train``), ``command`` (the command line) and ``namespace`` (which processes
the holder shares pids with: the kernel's boot id and the pid namespace on Linux, see :func:`process_namespace`). It is written to a temporary
file and hard-linked into place, which fails when a lock already exists, so a lock is never seen half written and two
processes never both create it (``link`` is atomic on local file systems and NFS alike).

While held, a daemon thread refreshes the file's modification time every :data:`HEARTBEAT_SECONDS`. A lock is stale,
and is taken over with a warning, when

- it was written in this process namespace (same host name, boot and pid namespace), and its process is gone, or
  its pid now belongs to another process (``pid_start`` differs);
- it was written anywhere else, and its heartbeat is older than :data:`STALE_AFTER_SECONDS` (the process there
  cannot be asked, so a lock whose holder stopped refreshing it for that long is presumed dead).

The host name alone does not make a lock's process one that can be asked: two containers often share a host name
(and an output folder mounted into both) but not their pids, so a pid that is free in one may be a live run in the
other. A lock that records no namespace (written by an older version) is therefore judged by its heartbeat too.
A process killed with SIGKILL leaves a lock that the next run in its own namespace takes over at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

logger = logging.getLogger(__name__)

LOCK_FILE = ".diffsynth.lock"
HEARTBEAT_SECONDS = 60.0
STALE_AFTER_SECONDS = 600.0


@dataclass(frozen=True)
class LockHolder:
    """Who holds a folder: the content of its lock file."""

    run_id: str
    pid: int
    host: str
    pid_start: int | None
    started: str
    purpose: str = ""
    command: str = ""
    namespace: str | None = None

    @classmethod
    def this_process(cls, run_id: str, purpose: str) -> LockHolder:
        """The record for the calling process."""
        return cls(run_id=run_id, pid=os.getpid(), host=socket.gethostname(), pid_start=process_start(os.getpid()),
                   started=datetime.now(timezone.utc).isoformat(timespec="seconds"), purpose=purpose,
                   command=" ".join(sys.argv)[:500], namespace=process_namespace())

    def describe(self) -> str:
        """One line for people: run, purpose, process, host and start time."""
        purpose = f" ({self.purpose})" if self.purpose else ""
        return f"run {self.run_id}{purpose}, process {self.pid} on host {self.host}, started {self.started}"


class FolderLockedError(RuntimeError):
    """The folder is held by a live process; ``holder`` says which, ``lock_path`` where the lock is."""

    def __init__(self, lock_path: Path, holder: LockHolder | None, heartbeat_age: float):
        self.lock_path, self.holder, self.heartbeat_age = lock_path, holder, heartbeat_age
        who = holder.describe() if holder is not None else "a process whose lock file cannot be read"
        super().__init__(f"{lock_path.parent} is in use by {who}; last heartbeat {heartbeat_age:.0f} s ago "
                         f"(lock file {lock_path})")


def process_start(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux), or None where ``/proc`` cannot tell.

    Together with the pid it names one process for good: a pid reused by a later process has another start time.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces; the start time is field 22.
    return int(stat.rsplit(")", 1)[1].split()[19])


def process_namespace() -> str | None:
    """Which processes this one shares pids with: ``<boot id>/<pid namespace>`` on Linux, the platform's name where
    there are no pid namespaces, or None where ``/proc`` cannot tell (then no lock's process is asked).

    The boot id tells machines (and boots) apart, the pid namespace containers on one machine; a pid means the same
    process only to processes with the same value.
    """
    if not sys.platform.startswith("linux"):
        return sys.platform
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="utf-8").strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (whoever owns it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists but belongs to another user
    return True


def read_lock(folder: str | os.PathLike) -> tuple[LockHolder | None, float] | None:
    """``(holder, heartbeat age in seconds)`` of the folder's lock, ``holder`` None when unreadable; None if unlocked."""
    path = Path(folder) / LOCK_FILE
    try:
        age = time.time() - path.stat().st_mtime
        record = json.loads(path.read_text(encoding="utf-8"))
        return LockHolder(**record), age
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError):
        return None, age


def stale_reason(holder: LockHolder | None, heartbeat_age: float) -> str | None:
    """Why a lock may be taken over, or None while its holder may still be running (rules in the module docstring)."""
    if holder is None:
        # Locks appear complete (written, then linked); an unreadable one is damage, trusted only while it is fresh.
        return f"its content is unreadable and {heartbeat_age:.0f} s old" if heartbeat_age > STALE_AFTER_SECONDS \
            else None
    namespace = process_namespace()
    if holder.host == socket.gethostname() and namespace is not None and holder.namespace == namespace:
        if not process_alive(holder.pid):
            return f"process {holder.pid} is no longer running"
        start = process_start(holder.pid)
        if holder.pid_start is not None and start is not None and start != holder.pid_start:
            return f"process {holder.pid} is no longer running (its pid now belongs to another process)"
        return None
    if heartbeat_age > STALE_AFTER_SECONDS:
        where = "" if holder.host != socket.gethostname() else " (another container or boot: its pid cannot be asked)"
        return f"its holder on host {holder.host}{where} has not refreshed it for {heartbeat_age / 60:.0f} min"
    return None


class FolderLock:
    """Holds ``<folder>/.diffsynth.lock`` from :meth:`acquire` to :meth:`release`.

    Args:
        folder: The folder to own; it must exist.
        purpose: What the holder does, shown to a process that is refused.
        run_id: Identifies the holder's run; a new random id when None.
    """

    def __init__(self, folder: str | os.PathLike, purpose: str = "", run_id: str | None = None):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self.holder = LockHolder.this_process(run_id or uuid.uuid4().hex[:12], purpose)
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def acquire(self) -> None:
        """Takes the lock, taking over a stale one with a warning.

        Raises:
            FolderLockedError: A live process holds the folder.
            OSError: The folder cannot be written (e.g. ``PermissionError``).
        """
        for _ in range(3):  # a takeover can lose a race with another starter; then look again
            if self._create():
                break
            found = read_lock(self.folder)
            if found is None:
                continue  # released in the meantime
            holder, age = found
            reason = stale_reason(holder, age)
            if reason is None:
                raise FolderLockedError(self.path, holder, age)
            who = holder.describe() if holder is not None else "an unknown holder"
            logger.warning("taking over the stale lock %s of %s: %s", self.path, who, reason)
            self._remove_if_unchanged(holder)
        else:
            found = read_lock(self.folder)
            raise FolderLockedError(self.path, *(found or (None, 0.0)))
        self._stop.clear()
        self._heartbeat = threading.Thread(target=self._beat, name=f"lock-heartbeat {self.folder}", daemon=True)
        self._heartbeat.start()

    def _create(self) -> bool:
        """Links a complete record into place; False when a lock exists."""
        record = json.dumps(asdict(self.holder), indent=2) + "\n"
        temporary = self.folder / f"{LOCK_FILE}.{self.holder.run_id}.{os.getpid()}.tmp"
        temporary.write_text(record, encoding="utf-8")
        try:
            os.link(temporary, self.path)
        except FileExistsError:
            return False
        except OSError:
            # A file system without hard links (some FUSE and SMB mounts): create exclusively, then write. A reader
            # may then see the record half written, which counts as a live holder while it is fresh.
            try:
                descriptor = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                handle.write(record)
        finally:
            temporary.unlink(missing_ok=True)
        return True

    def _remove_if_unchanged(self, stale: LockHolder | None) -> None:
        """Removes the stale lock, unless another starter replaced it since it was read (then it is put back)."""
        tombstone = self.folder / f"{LOCK_FILE}.stale.{self.holder.run_id}"
        try:
            os.replace(self.path, tombstone)
        except FileNotFoundError:
            return
        try:
            record = LockHolder(**json.loads(tombstone.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            record = None
        if record != stale:
            # A live lock moved by mistake goes back, unless a newer one exists (or links are unsupported: then the
            # two starters both run, as they would without the lock; this needs two of them within microseconds).
            with contextlib.suppress(OSError):
                os.link(tombstone, self.path)
        tombstone.unlink(missing_ok=True)

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            found = read_lock(self.folder)
            if found is None or found[0] != self.holder:
                logger.warning("the lock %s no longer names this run (%s); another process took the folder over",
                               self.path, self.holder.describe())
                return
            try:
                os.utime(self.path)
            except OSError as error:
                logger.warning("cannot refresh the lock %s (%s)", self.path, error)

    def release(self) -> None:
        """Stops the heartbeat and removes the lock if it is still this process's; safe to call twice."""
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
            self._heartbeat = None
            found = read_lock(self.folder)
            if found is not None and found[0] == self.holder:
                self.path.unlink(missing_ok=True)

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()
