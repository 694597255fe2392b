"""Atomic writes for files users keep (LoRA weights, checkpoints, stage-1 caches, JSON records), and folders that a
failed step leaves behind empty.

A file is written to a temporary sibling in the same folder, flushed to disk, then renamed over the target. A run
killed mid-write therefore leaves either the old file or the new one, never a truncated file that a later resume
would trust.

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
from typing import Any

import torch


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Calls ``write(temporary_path)``, then renames the temporary file to ``path``.

    Args:
        path: The final file. Its folder is created if missing.
        write: Writes the complete file at the path it is given.

    Returns:
        ``path`` as a ``Path``.

    Raises:
        IsADirectoryError: ``path`` is an existing folder.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder; cannot write a file there (choose another output path)")
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(descriptor)
    temporary_path = Path(temporary)
    try:
        write(temporary_path)
        with open(temporary_path, "rb+") as handle:
            os.fsync(handle.fileno())
        # mkstemp makes the file private (0600); give it the permissions an ordinary open() would have.
        os.chmod(temporary_path, 0o666 & ~_current_umask())
        os.replace(temporary_path, path)
    except BaseException:
        temporary_path.unlink(missing_ok=True)
        raise
    return path


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Writes ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))


def atomic_write_json(path: str | os.PathLike, payload: Any) -> Path:
    """Writes ``payload`` as indented JSON to ``path`` atomically."""
    return atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


def atomic_save_safetensors(tensors: Mapping[str, torch.Tensor], path: str | os.PathLike,
                            metadata: Mapping[str, str] | None = None) -> Path:
    """Saves ``tensors`` as a safetensors file atomically; ``metadata`` values must be strings."""
    from safetensors.torch import save_file

    contiguous = {name: tensor.detach().contiguous() for name, tensor in tensors.items()}
    return atomic_write(path, lambda temporary: save_file(contiguous, str(temporary), metadata=dict(metadata or {})))


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
