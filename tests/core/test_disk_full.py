"""A full disk while writing a file: the error names the file, the space it needs and the space free, the partial
file is removed, and the files written before it are untouched.

The disk is filled by a writer that writes part of the file and then fails as a full disk does: safetensors' own
error (its text as the Rust writer words it on ENOSPC) or Python's ``OSError(ENOSPC)``.
"""

import errno
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from diffsynth.core.disk_full import DiskFullError, format_bytes, is_disk_full
from diffsynth.core.files import atomic_save_safetensors, atomic_write, atomic_write_text, safetensors_size
from diffsynth.core.safetensors_stream import SafetensorsStream

# What safetensors 0.4+ raises when the disk fills (seen on a 64 kB tmpfs).
SAFETENSORS_ENOSPC = "Error while serializing: I/O error: No space left on device (os error 28)"


def fill_disk_in_save_file(monkeypatch, fails=lambda path: True):
    """The safetensors writer (``SafetensorsStream``, behind ``atomic_save_safetensors``) writes half of each file
    ``fails`` picks, then fails as on a full disk."""
    close = SafetensorsStream.close

    def half_then_full(stream):
        close(stream)
        if fails(str(stream.path)):
            os.truncate(stream.path, os.path.getsize(stream.path) // 2)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(SafetensorsStream, "close", half_then_full)


def test_a_full_disk_during_a_safetensors_save_names_the_file_and_the_space(tmp_path, monkeypatch):
    earlier = atomic_save_safetensors({"w": torch.ones(4)}, tmp_path / "epoch-0.safetensors")
    tensors = {"w": torch.zeros(1000, 10)}
    fill_disk_in_save_file(monkeypatch)
    with pytest.raises(DiskFullError) as error:
        atomic_save_safetensors(tensors, tmp_path / "epoch-1.safetensors")
    message = str(error.value)
    needed = safetensors_size(tensors)
    free = shutil.disk_usage(tmp_path).free
    assert message.startswith(f"no space left on the disk: writing {tmp_path / 'epoch-1.safetensors'} needs "
                              f"{format_bytes(needed)} and ")
    assert error.value.needed == needed and abs(error.value.free - free) < 1e8  # other writers on this disk
    assert "the files written before it are intact" in message and error.value.errno == errno.ENOSPC
    assert sorted(path.name for path in tmp_path.iterdir()) == ["epoch-0.safetensors"]  # no partial, no temporary
    assert torch.equal(load_file(str(earlier))["w"], torch.ones(4))


def test_a_full_disk_during_a_python_write_is_named_too(tmp_path):
    atomic_write_text(tmp_path / "progress.json", "{}")

    def write_then_full(temporary):
        temporary.write_bytes(b"x" * 300)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(DiskFullError, match=r"writing .*metrics\.csv needs more than the 300 B written before the "
                                            r"disk filled and .* are free in"):
        atomic_write(tmp_path / "metrics.csv", write_then_full)
    assert [path.name for path in tmp_path.iterdir()] == ["progress.json"]


def test_only_a_full_disk_counts_as_one():
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert is_disk_full(SafetensorError(SAFETENSORS_ENOSPC))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(SafetensorError("Error while serializing: I/O error: Permission denied (os error 13)"))
    assert not is_disk_full(RuntimeError("No space left on device (os error 28)"))


def test_the_error_survives_pickling_as_between_processes():
    import pickle

    error = pickle.loads(pickle.dumps(DiskFullError("no space left on the disk: ...", Path("a.safetensors"), 9, 1)))
    assert (str(error), error.path, error.needed, error.free, error.errno) == (
        "no space left on the disk: ...", Path("a.safetensors"), 9, 1, errno.ENOSPC)
