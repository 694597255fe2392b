"""Atomic writes for files users keep (LoRA weights, checkpoints, stage-1 caches, JSON records), and folders that a
failed step leaves behind empty.

A file is written to a temporary sibling in the same folder, flushed to disk, then renamed over the target. A run
killed mid-write therefore leaves either the old file or the new one, never a truncated file that a later resume
would trust. Inside an output folder that a run records (:mod:`diffsynth.core.written_files`), each file written is
noted there, so that replacing the run's outputs later removes exactly its files. A write the disk has no room for
removes its temporary file and raises :class:`~diffsynth.core.disk_full.DiskFullError`, naming the file, the space it
needs and the space free.

A step that creates a folder and then fails (a download that cannot reach its hub, a run that stops before writing
anything) removes the folders it created with :func:`missing_folders` and :func:`remove_empty_folders`, so that an
empty ``models/Qwen/Qwen-Image/`` never suggests that something is there.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .disk_full import disk_full_error, is_disk_full
from .written_files import record_written

if TYPE_CHECKING:  # torch is imported by the callers that hold tensors; the flag parser imports this module
    import torch


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None], size: int | None = None) -> Path:
    """Calls ``write(temporary_path)``, then renames the temporary file to ``path``.

    Args:
        path: The final file. Its folder is created if missing.
        write: Writes the complete file at the path it is given.
        size: The bytes the file will take, if known: a full disk's message names it.

    Returns:
        ``path`` as a ``Path``.

    Raises:
        IsADirectoryError: ``path`` is an existing folder.
        DiskFullError: The disk ran out of space; the temporary file is removed and the message names the file,
            the space it needs and the space free (``disk_full``).
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder; cannot write a file there (choose another output path)")
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(descriptor)
    temporary_path = Path(temporary)
    record_written(temporary_path, temporary=True)  # so that one a killed write leaves behind is known as ours
    try:
        write(temporary_path)
        with open(temporary_path, "rb+") as handle:
            os.fsync(handle.fileno())
        # mkstemp makes the file private (0600); give it the permissions an ordinary open() would have.
        os.chmod(temporary_path, 0o666 & ~_current_umask())
        os.replace(temporary_path, path)
    except BaseException as error:
        written = temporary_path.stat().st_size if temporary_path.is_file() else 0
        temporary_path.unlink(missing_ok=True)
        if is_disk_full(error):
            raise disk_full_error(path, size, written) from error
        raise
    record_written(path)
    return path


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Writes ``text`` (UTF-8) to ``path`` atomically."""
    data = text.encode("utf-8")
    return atomic_write(path, lambda temporary: temporary.write_bytes(data), size=len(data))


def atomic_write_json(path: str | os.PathLike, payload: Any) -> Path:
    """Writes ``payload`` as indented JSON to ``path`` atomically."""
    return atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


def atomic_save_safetensors(tensors: Mapping[str, torch.Tensor], path: str | os.PathLike,
                            metadata: Mapping[str, str] | None = None) -> Path:
    """Saves ``tensors`` as a safetensors file atomically; ``metadata`` values must be strings.

    Written by :class:`~diffsynth.core.safetensors_stream.SafetensorsStream`, not ``safetensors.torch.save_file``,
    which views each tensor through a ctypes array type of its byte size that ctypes caches for good: a process that
    writes tensors of ever new sizes (stage 1, one cache file per sample, sized by its image and prompt) kept about
    6 KiB per new size.
    """
    from .safetensors_stream import SafetensorsStream

    contiguous = {name: tensor.detach().contiguous() for name, tensor in tensors.items()}
    metadata = dict(metadata or {})

    def write(temporary: Path) -> None:
        stream = SafetensorsStream(temporary, [(name, tensor.shape, tensor.dtype) for name, tensor in contiguous.items()],
                                   metadata)
        for name, tensor in contiguous.items():
            stream.write(name, tensor)
        stream.close()

    return atomic_write(path, write, size=safetensors_size(contiguous, metadata))


def safetensors_size(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> int:
    """The bytes of the safetensors file of ``tensors``: the data, and the JSON header (as safetensors writes it,
    give or take the dtype names' length) with its 8-byte length and padding to 8 bytes."""
    offset, header = 0, {"__metadata__": dict(metadata)} if metadata else {}
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": str(tensor.dtype), "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header_bytes = len(json.dumps(header, separators=(",", ":")).encode("utf-8"))
    return 8 + -(-header_bytes // 8) * 8 + offset


def missing_folders(folder: str | os.PathLike) -> list[Path]:
    """``folder`` and those of its parents that do not exist yet, deepest first: what ``mkdir(parents=True)`` would
    create. Take it before the step that may create them."""
    folder = Path(folder).absolute()
    return [path for path in (folder, *folder.parents) if not path.exists()]


def remove_empty_folders(folders: Iterable[str | os.PathLike]) -> None:
    """Removes each of ``folders`` (deepest first, as :func:`missing_folders` lists them) with the empty sub-folders
    in it, if it then is empty; stops at the first one that holds a file, as its parents then hold it too."""
    for folder in map(Path, folders):
        if not folder.is_dir():
            continue  # never created (the step failed before it), or already removed
        for path, _, _ in os.walk(folder, topdown=False):
            with contextlib.suppress(OSError):  # a folder that holds something stays
                os.rmdir(path)
        if folder.exists():
            return
