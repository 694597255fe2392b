"""A full disk named as such: the file being written, the space it needs and the space there is.

A write that runs out of space fails as ``OSError(ENOSPC)`` from Python's own writes (``EDQUOT`` past a quota), and
as safetensors' ``SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")``
from its Rust writer, which names neither the file nor the folder. :func:`~diffsynth.core.files.atomic_write` turns
either into a :class:`DiskFullError` once it has removed its temporary file: the message names the file, the bytes
it needs against the bytes free on that disk, and says that the files written before it are intact (every file is
written atomically, so an earlier file was never touched and the file itself keeps its previous version, if any).
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

_NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(OSError):
    """The disk ran out of space while writing ``path``; ``needed`` and ``free`` are bytes (``needed`` None when
    the writer could not tell it in advance). Its ``errno`` is ``ENOSPC``, for callers that test ``OSError``\\s."""

    def __init__(self, message: str, path: Path | None = None, needed: int | None = None,
                 free: int | None = None) -> None:
        super().__init__(errno.ENOSPC, message, None if path is None else str(path))
        self.message, self.path, self.needed, self.free = message, path, needed, free

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple:
        # OSError pickles as (errno, strerror, filename), which this constructor does not take.
        return type(self), (self.message, self.path, self.needed, self.free)


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` says the disk (or the user's quota) is full, as an ``OSError`` or as safetensors' error."""
    if isinstance(error, DiskFullError):
        return True
    if isinstance(error, OSError):
        return error.errno in _NO_SPACE_ERRNOS
    # safetensors raises its own exception type, with the OS error only in the text.
    return type(error).__name__ == "SafetensorError" and any(f"(os error {number})" in str(error)
                                                               for number in _NO_SPACE_ERRNOS)


def free_bytes(folder: str | os.PathLike) -> int | None:
    """The bytes free for this user on the disk holding ``folder`` (None if it cannot be asked)."""
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def format_bytes(count: int) -> str:
    """``count`` bytes for a person: ``512 B``, ``3.2 MB``, ``1.5 GB`` (powers of 1000, as disk tools print)."""
    if count < 1000:
        return f"{count} B"
    for unit, scale in (("kB", 1e3), ("MB", 1e6), ("GB", 1e9)):
        if count < scale * 1000:
            return f"{count / scale:.1f} {unit}"
    return f"{count / 1e12:.1f} TB"


def disk_full_error(path: str | os.PathLike, needed: int | None, written: int = 0) -> DiskFullError:
    """The error for a write of ``path`` that ran out of space, its partial file already removed.

    Args:
        path: The file that was being written.
        needed: The bytes the whole file takes, if the writer knows it.
        written: The bytes written before the disk filled (a lower bound when ``needed`` is unknown).
    """
    path = Path(path)
    free = free_bytes(path.parent)
    want = (f"needs {format_bytes(needed)}" if needed is not None
            else f"needs more than the {format_bytes(written)} written before the disk filled")
    have = f"{format_bytes(free)} are free" if free is not None else "the free space cannot be read"
    fix = (f"Free at least {format_bytes(needed - free)} there" if needed is not None and free is not None
           and needed > free else "Free space there")
    message = (f"no space left on the disk: writing {path} {want} and {have} in {path.parent}. The partial file was "
               f"removed; the files written before it are intact. {fix} (or write to a larger disk) and run again")
    return DiskFullError(message, path, needed, free)
