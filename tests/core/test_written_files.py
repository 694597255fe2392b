"""The record of written files: what the atomic writers note, and which files still count as written by the run."""

import os
import shutil

import torch

from diffsynth.core.files import atomic_save_safetensors, atomic_write_text
from diffsynth.core.written_files import (
    RECORD_DIR,
    record_files,
    record_written,
    record_written_tree,
    recorded_files,
    start_recording,
)


def test_the_atomic_writers_record_their_files_inside_the_folder_only(tmp_path):
    folder, outside = tmp_path / "out", tmp_path / "elsewhere.txt"
    atomic_write_text(folder / "before.txt", "written before the recording")
    recording = start_recording(folder, "run1")
    try:
        atomic_write_text(folder / "notes" / "a.txt", "a")
        atomic_save_safetensors({"w": torch.ones(2)}, folder / "w.safetensors")
        atomic_write_text(outside, "not in the folder")
    finally:
        recording.stop()
    atomic_write_text(folder / "after.txt", "written after it stopped")
    assert record_files(folder) == [folder / RECORD_DIR / f"run1.{os.getpid()}.jsonl"]
    assert recorded_files(folder) == [folder / "notes" / "a.txt", folder / "w.safetensors"]


def test_a_file_changed_since_it_was_written_is_no_longer_the_runs(tmp_path):
    recording = start_recording(tmp_path, "run1")
    try:
        for name in ("replaced.txt", "edited.txt", "kept.txt"):
            atomic_write_text(tmp_path / name, "written by the run")
    finally:
        recording.stop()
    (tmp_path / "replaced.txt").unlink()
    (tmp_path / "replaced.txt").write_text("written by the run")  # same content, but a new file
    with open(tmp_path / "edited.txt", "a") as handle:
        handle.write("!")
    os.utime(tmp_path / "replaced.txt", ns=(1, 1))
    assert recorded_files(tmp_path) == [tmp_path / "kept.txt"]


def test_a_growing_log_counts_while_it_only_grows(tmp_path):
    log = tmp_path / "logs" / "metrics.csv"
    log.parent.mkdir()
    log.write_text("step,loss\n1,0.5\n")
    recording = start_recording(tmp_path, "run1")
    try:
        record_written(log, grows=True)
    finally:
        recording.stop()
    with open(log, "a") as handle:
        handle.write("2,0.4\n")
    assert recorded_files(tmp_path) == [log]
    log.write_text("step,loss\n1,0.9\n2,0.4\n")  # rewritten from the start by someone else
    assert recorded_files(tmp_path) == []


def test_a_folder_renamed_into_place_is_recorded_whole_and_a_killed_writes_leftover_too(tmp_path):
    recording = start_recording(tmp_path, "run1")
    try:
        staging = tmp_path / "checkpoints" / ".step-2.tmp"
        atomic_write_text(staging / "progress.json", "{}")
        atomic_write_text(staging / "sub" / "shard.bin", "x")
        os.replace(staging, tmp_path / "checkpoints" / "step-2")
        record_written_tree(tmp_path / "checkpoints" / "step-2")
        leftover = tmp_path / ".epoch-0.safetensors.k2j4.tmp"
        recording.record(leftover, temporary=True)  # as atomic_write notes it before writing
        leftover.write_bytes(b"half a file")  # the write was killed here
    finally:
        recording.stop()
    assert recorded_files(tmp_path) == [leftover, tmp_path / "checkpoints" / "step-2" / "progress.json",
                                        tmp_path / "checkpoints" / "step-2" / "sub" / "shard.bin"]


def test_a_damaged_record_counts_nothing_it_cannot_read_and_nothing_outside_the_folder(tmp_path):
    folder = tmp_path / "out"
    recording = start_recording(folder, "run1")
    try:
        atomic_write_text(folder / "a.txt", "a")
    finally:
        recording.stop()
    (tmp_path / "victim.txt").write_text("outside")
    stat = (tmp_path / "victim.txt").stat()
    with open(record_files(folder)[0], "a") as handle:
        handle.write(f'{{"path": "../victim.txt", "size": {stat.st_size}, "mtime_ns": {stat.st_mtime_ns}}}\n'
                     '{"path": "b.t')
    assert recorded_files(folder) == [folder / "a.txt"]
    shutil.rmtree(folder / RECORD_DIR)
    assert record_files(folder) == [] and recorded_files(folder) == []
