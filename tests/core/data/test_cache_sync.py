"""A stage-1 rerun settles the cache folder: keeps matching samples, recomputes changed ones, removes orphans.

Stage 1 is played here as the runner plays it (sync, manifest, compute the todo list), with a dataset of real images
and a state that records the caption it was computed from.
"""

import os

import pytest
from PIL import Image

from diffsynth.core.data import (CacheDataset, CacheError, UnifiedDataset, cache_file_path, list_cache_files,
                                 load_cache_sample, read_cache_fingerprint, save_cache_sample, sync_stage_one_cache,
                                 write_cache_info, write_cache_manifest)
from diffsynth.core.data.cache_sync import summarise

INFO = {"units": ["PromptEmbedder"]}
MODELS = "models-digest"


def make_dataset(folder, captions, **kwargs):
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["image,prompt"]
    for index, caption in enumerate(captions):
        if not (folder / f"{index}.png").exists():
            Image.new("RGB", (64, 48), (40 * index, 0, 0)).save(folder / f"{index}.png")
        lines.append(f"{index}.png,{caption}")
    (folder / "metadata.csv").write_text("\n".join(lines) + "\n")
    return UnifiedDataset(folder, folder / "metadata.csv", keep_row_indices=True, **kwargs)


def stage_one(dataset, cache, num_processes=1, stop_after=None):
    """The runner's stage 1 for ``num_processes`` processes in turn; returns the summary line and what was computed."""
    write_cache_info(cache, INFO)
    syncs = [sync_stage_one_cache(cache, process, num_processes, len(dataset.rows),
                                  lambda index, stored: dataset.fingerprint(index, MODELS, stored))
             for process in range(num_processes)]
    write_cache_manifest(cache, len(dataset.rows), {}, "accelerate launch train.py --task sft:data_process")
    computed = []
    for process, sync in enumerate(syncs):
        for index in sync.todo:
            if len(computed) == stop_after:
                break
            sample = dataset[index]
            state = {"shared": {"prompt": sample["prompt"], "size": sample["image"].size}, "posi": {}, "nega": {}}
            save_cache_sample(cache_file_path(cache, process, index), state, INFO, sync.fingerprints[index])
            computed.append(index)
    return summarise(sync.counts() for sync in syncs), computed


def cached_prompts(cache):
    return {int(path.stem): load_cache_sample(path)["shared"]["prompt"] for path in list_cache_files(cache)}


def test_a_rerun_recomputes_the_fixed_caption_and_removes_the_rows_that_are_gone(tmp_path):
    data, cache = tmp_path / "data", tmp_path / "cache"
    assert stage_one(make_dataset(data, ["a", "b", "c", "d"]), cache) == ("0 cached, 4 new", [0, 1, 2, 3])
    assert stage_one(make_dataset(data, ["a", "b", "c", "d"]), cache) == ("4 cached, 0 new", [])
    summary, computed = stage_one(make_dataset(data, ["a", "B fixed", "c"]), cache)
    assert summary == "2 cached, 1 changed (row), 0 new, 1 orphan removed" and computed == [1]
    assert cached_prompts(cache) == {0: "a", 1: "B fixed", 2: "c"}


def test_a_replaced_image_and_a_new_setting_are_changes(tmp_path):
    data, cache = tmp_path / "data", tmp_path / "cache"
    stage_one(make_dataset(data, ["a", "b"]), cache)
    Image.new("RGB", (64, 48), "green").save(data / "1.png")
    assert stage_one(make_dataset(data, ["a", "b"]), cache) == ("1 cached, 1 changed (files), 0 new", [1])
    summary, computed = stage_one(make_dataset(data, ["a", "b"], height=32, width=32), cache)
    assert summary == "0 cached, 2 changed (settings), 0 new" and computed == [0, 1]
    assert {load_cache_sample(path)["shared"]["size"] for path in list_cache_files(cache)} == {(32, 32)}


def test_a_copied_dataset_is_re_stamped_once_instead_of_recomputed(tmp_path):
    data, cache = tmp_path / "data", tmp_path / "cache"
    stage_one(make_dataset(data, ["a", "b"]), cache)
    for name in ("0.png", "1.png"):
        stat = os.stat(data / name)
        os.utime(data / name, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    summary, computed = stage_one(make_dataset(data, ["a", "b"]), cache)
    assert summary == "2 cached, 0 new, 2 re-stamped (data files touched, content unchanged)" and computed == []
    assert read_cache_fingerprint(cache_file_path(cache, 0, 0)).files[0].mtime_ns == os.stat(data / "0.png").st_mtime_ns
    assert stage_one(make_dataset(data, ["a", "b"]), cache) == ("2 cached, 0 new", [])


def test_another_process_count_moves_the_files_it_can_keep(tmp_path):
    data, cache = tmp_path / "data", tmp_path / "cache"
    stage_one(make_dataset(data, ["a", "b", "c"]), cache, num_processes=2)
    assert sorted(path.parent.name for path in list_cache_files(cache)) == ["0", "0", "1"]
    # A stray second copy of sample 0, as an older run with three processes would have left in folder 2.
    (cache / "2").mkdir()
    (cache / "2" / "0.safetensors").write_bytes(cache_file_path(cache, 0, 0).read_bytes())
    summary, computed = stage_one(make_dataset(data, ["a", "b", "c"]), cache, num_processes=1)
    assert summary == "3 cached, 0 new, 1 orphan removed, 1 moved between process folders" and computed == []
    assert [path.parent.name for path in list_cache_files(cache)] == ["0", "0", "0"]
    assert cached_prompts(cache) == {0: "a", 1: "b", 2: "c"}


def test_files_from_before_fingerprints_or_unreadable_ones_are_recomputed(tmp_path):
    data, cache = tmp_path / "data", tmp_path / "cache"
    stage_one(make_dataset(data, ["a", "b"]), cache)
    save_cache_sample(cache_file_path(cache, 0, 0), {"shared": {"prompt": "old"}, "posi": {}, "nega": {}}, INFO)
    cache_file_path(cache, 0, 1).write_bytes(b"garbage")
    assert stage_one(make_dataset(data, ["a", "b"]), cache) == ("0 cached, 2 changed (unreadable), 0 new", [0, 1])
    assert cached_prompts(cache) == {0: "a", 1: "b"}


def test_an_interrupted_rerun_leaves_no_stale_sample_for_stage_two(tmp_path):
    data, cache = tmp_path / "data", tmp_path / "cache"
    stage_one(make_dataset(data, ["a", "b", "c"]), cache)
    assert stage_one(make_dataset(data, ["A", "B", "C"]), cache, stop_after=1)[1] == [0]
    assert cached_prompts(cache) == {0: "A"}, "stale samples are deleted before any is recomputed"
    with pytest.raises(CacheError, match="2 of its 3 samples are missing"):
        CacheDataset(cache, expected_info=INFO)


def test_the_summary_adds_up_every_process():
    counts = [{"cached": 1, "changed": {"row": 1, "files": 1}, "changed_samples": 1, "new": 2, "orphans": 1,
               "restamped": 0, "moved": 0},
              {"cached": 2, "changed": {"row": 1}, "changed_samples": 1, "new": 0, "orphans": 1, "restamped": 0,
               "moved": 0}]
    assert summarise(counts, skipped=1) == ("3 cached, 2 changed (files, row), 2 new, 2 orphans removed, "
                                            "1 skipped (undecodable)")
