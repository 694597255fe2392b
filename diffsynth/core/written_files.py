"""The record of the files a run wrote into its output folder, so that replacing its outputs deletes those only.

While a recording is active for a folder (:func:`start_recording`), every file written under it is noted in
``<folder>/.diffsynth/written/<run id>.<pid>.jsonl``, one JSON line per write: the path relative to the folder, its
size and modification time in nanoseconds. The atomic writers of :mod:`diffsynth.core.files` note their files
themselves (and, before writing, their temporary file, so that one left by a killed write is known too); a writer
that goes around them calls :func:`record_written` for a file (``grows=True`` for a log it keeps appending to: then
its size and a hash of its first bytes are noted, and any longer file that starts the same still counts) or
:func:`record_written_tree` for a folder it renamed into place.

A file counts as the run's (:func:`recorded_files`) only while it still is what was noted: same size and
modification time (a growing file: at least that size, same first bytes). A file someone replaced or edited since is
not, and neither is anything never noted. Each process keeps its own record file, so the processes of one launch
(stage 1 writes on all of them) note their files without coordinating, on NFS too. A line lost in a crash makes its
file look foreign, which keeps it: the safe direction.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import IO

logger = logging.getLogger(__name__)

RECORD_DIR = Path(".diffsynth") / "written"
#: How much of a growing file's start is hashed: enough for a log's header and first entries.
HEAD_BYTES = 64 * 1024

_active: list[WrittenFiles] = []
_active_lock = threading.Lock()


class WrittenFiles:
    """One process's record of the files it writes under ``folder`` (see the module docstring).

    Args:
        folder: The output folder.
        run_id: The run's id; it names the record file and is kept in each entry.
    """

    def __init__(self, folder: str | os.PathLike, run_id: str):
        self.folder = Path(os.path.abspath(folder))
        self.run_id = run_id
        self.path = self.folder / RECORD_DIR / f"{run_id}.{os.getpid()}.jsonl"
        self._handle: IO[str] | None = None  # opened at the first entry: a run that writes nothing leaves nothing
        self._lock = threading.Lock()
        self._warned = False

    def covers(self, path: str | os.PathLike) -> bool:
        """Whether ``path`` lies inside the folder (and is not the record itself)."""
        absolute = Path(os.path.abspath(path))
        return absolute.is_relative_to(self.folder) and not absolute.is_relative_to(self.folder / RECORD_DIR)

    def record(self, path: str | os.PathLike, grows: bool = False, temporary: bool = False) -> None:
        """Notes the file at ``path`` as it is now; ``temporary`` notes a writer's temporary file before it is
        written (it counts while it exists, whatever it holds: its random name is the writer's alone).

        A note that cannot be written (a full disk) is warned about once and does not fail the write: the file then
        counts as someone else's and is kept, the safe side.
        """
        absolute = Path(os.path.abspath(path))
        entry: dict[str, object] = {"path": absolute.relative_to(self.folder).as_posix(), "run_id": self.run_id}
        try:
            if temporary:
                entry["temporary"] = True
            else:
                status = absolute.lstat()
                entry.update(size=status.st_size, mtime_ns=status.st_mtime_ns)
                if grows:
                    entry.update(grows=True, head=_head_hash(absolute, status.st_size))
            self._append(entry)
        except OSError as error:
            if not self._warned:
                self._warned = True
                logger.warning("cannot record %s in %s (%s: %s); files left unrecorded count as someone else's and "
                               "are kept when the run's outputs are replaced", absolute, self.path,
                               type(error).__name__, error)

    def record_tree(self, folder: str | os.PathLike) -> None:
        """Notes every file under ``folder`` (one renamed into place whole, e.g. a checkpoint folder)."""
        for parent, _, names in os.walk(folder):
            for name in sorted(names):
                self.record(Path(parent) / name)

    def _append(self, entry: dict[str, object]) -> None:
        with self._lock:
            if self._handle is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open until stop()
            self._handle.write(json.dumps(entry, sort_keys=True) + "\n")
            self._handle.flush()

    def stop(self) -> None:
        """Ends the recording; safe to call twice."""
        with _active_lock:
            if self in _active:
                _active.remove(self)
        with self._lock:
            if self._handle is not None:
                self._handle.close()
                self._handle = None


def start_recording(folder: str | os.PathLike, run_id: str) -> WrittenFiles:
    """Notes from now on every file the atomic writers (and :func:`record_written`) write under ``folder``."""
    recording = WrittenFiles(folder, run_id)
    with _active_lock:
        _active.append(recording)
    return recording


def _recording_for(path: str | os.PathLike) -> WrittenFiles | None:
    with _active_lock:
        return next((recording for recording in reversed(_active) if recording.covers(path)), None)


def record_written(path: str | os.PathLike, grows: bool = False, temporary: bool = False) -> None:
    """Notes a file just written, if a recording covers its folder (else does nothing). See the module docstring."""
    recording = _recording_for(path)
    if recording is not None:
        recording.record(path, grows=grows, temporary=temporary)


def record_written_tree(folder: str | os.PathLike) -> None:
    """Notes every file under ``folder``, if a recording covers it: call it after renaming a folder into place."""
    recording = _recording_for(folder)
    if recording is not None:
        recording.record_tree(folder)


def _head_hash(path: Path, size: int) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read(min(size, HEAD_BYTES))).hexdigest()


def record_files(folder: str | os.PathLike) -> list[Path]:
    """The record files under ``folder`` (empty for a folder written by a version that kept none)."""
    return sorted((Path(folder) / RECORD_DIR).glob("*.jsonl"))


def _still_as_recorded(path: Path, entry: dict) -> bool:
    try:
        status = path.lstat()
    except OSError:
        return False
    if not path.is_file() or path.is_symlink():
        return False
    try:
        if entry.get("temporary"):
            return True
        if entry.get("grows"):
            return status.st_size >= entry["size"] and _head_hash(path, entry["size"]) == entry["head"]
        return status.st_size == entry["size"] and status.st_mtime_ns == entry["mtime_ns"]
    except (KeyError, TypeError, OSError):
        return False  # a damaged entry proves nothing


def recorded_files(folder: str | os.PathLike) -> list[Path]:
    """The files under ``folder`` that some run recorded and that are still as it wrote them, sorted."""
    folder = Path(folder)
    entries: dict[str, list[dict]] = {}
    for record in record_files(folder):
        with contextlib.suppress(OSError), open(record, encoding="utf-8") as handle:
            for line in handle:
                try:
                    entry = json.loads(line)
                    relative = Path(entry["path"])
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut short by a crash
                if relative.is_absolute() or ".." in relative.parts:
                    continue  # never outside the folder, whatever a damaged record says
                entries.setdefault(relative.as_posix(), []).append(entry)
    return sorted(folder / relative for relative, noted in entries.items()
                  if any(_still_as_recorded(folder / relative, entry) for entry in noted))
