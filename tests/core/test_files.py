"""Atomic writes: complete files or none, no temporary left behind, ordinary permissions."""

import os
import stat

import pytest
import torch
from safetensors.torch import load_file

from diffsynth.core.files import atomic_save_safetensors, atomic_write, atomic_write_json, atomic_write_text


def test_files_get_the_permissions_of_an_ordinary_open(tmp_path):
    previous = os.umask(0o022)
    try:
        path = atomic_write_text(tmp_path / "a.txt", "hello")
        reference = tmp_path / "b.txt"
        reference.write_text("hello")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE(reference.stat().st_mode) == 0o644


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    atomic_write_json(tmp_path / "state.json", {"step": 1})

    def broken(temporary):
        temporary.write_text("half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        atomic_write(tmp_path / "state.json", broken)
    assert (tmp_path / "state.json").read_text().strip().endswith("}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_safetensors_round_trip_and_folder_target_refused(tmp_path):
    path = atomic_save_safetensors({"w": torch.arange(4.0)}, tmp_path / "sub" / "w.safetensors", {"k": "v"})
    assert torch.equal(load_file(str(path))["w"], torch.arange(4.0))
    with pytest.raises(IsADirectoryError, match="is a folder"):
        atomic_write_text(tmp_path / "sub", "x")
