"""Atomic writes: complete files or none, no temporary left behind, ordinary permissions."""

import os
import stat

import pytest
import torch
from safetensors.torch import load_file

from diffsynth.core.files import (atomic_save_safetensors, atomic_write, atomic_write_json, atomic_write_text,
                                  missing_folders, remove_empty_folders)


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


def test_folders_a_failed_step_created_are_removed_when_left_empty(tmp_path):
    (tmp_path / "kept").mkdir()
    created = missing_folders(tmp_path / "kept" / "new" / "deeper")
    assert created == [tmp_path / "kept" / "new" / "deeper", tmp_path / "kept" / "new"]
    (tmp_path / "kept" / "new" / "deeper" / "empty_sub").mkdir(parents=True)
    remove_empty_folders(created)
    assert list(tmp_path.rglob("*")) == [tmp_path / "kept"]
    # A folder that got a file is kept, and with it every folder above it.
    created = missing_folders(tmp_path / "kept" / "new" / "deeper")
    (tmp_path / "kept" / "new" / "deeper").mkdir(parents=True)
    (tmp_path / "kept" / "new" / "file.txt").write_text("x")
    remove_empty_folders(created)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["file.txt", "kept", "new"]
    remove_empty_folders(missing_folders(tmp_path / "never" / "made"))  # nothing made: nothing to do
