"""Atomic writes for files users keep (LoRA weights, checkpoints, stage-1 caches, JSON records).

A file is written to a temporary sibling in the same folder, flushed to disk, then renamed over the target. A run
killed mid-write therefore leaves either the old file or the new one, never a truncated file that a later resume
would trust.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping
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
