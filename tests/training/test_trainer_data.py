"""The trainer on the tiny Qwen-Image and damaged or edited datasets: stage-1 reruns that know what their cache holds,
stage 2 on an incomplete cache, and undecodable files found at start-up or on first touch (issue 14, problems 2
and 5)."""

import csv
import json
import os
import subprocess
import sys

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from diffsynth.core.data import CacheError, DatasetError, list_cache_files, load_cache_sample, read_cache_manifest
from diffsynth.core.data.example_dataset import build_example_dataset
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.training.entry import main
from diffsynth.training.startup import dataset as startup_dataset
from tests.conftest import reset_accelerate_state
from tests.training.test_trainer import COMMON, PATTERN, REPO, raw, stage_two_argv
from tests.launching import accelerate_launch


@pytest.fixture(autouse=True)
def in_process_runs(base, fresh_accelerate_state):
    """Every test here runs the trainer in-process on the tiny repos."""


def write_rows(folder, rows):
    with open(folder / "metadata.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["image", "prompt"])
        writer.writerows(rows)


def read_rows(folder):
    with open(folder / "metadata.csv", newline="", encoding="utf-8") as handle:
        return [(row["image"], row["prompt"]) for row in csv.DictReader(handle)]


@pytest.fixture
def dataset(tmp_path):
    folder = tmp_path / "data"
    build_example_dataset(folder, num_images=4, seed=1)
    return folder


def stage_one(dataset, cache, *extra):
    reset_accelerate_state()
    return main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(cache), "--task",
                                    "sft:data_process", "--offload_models", PATTERN["dit"], *extra])


def stage_two(cache, output, *extra):
    reset_accelerate_state()
    return main(QwenImagePipeline, stage_two_argv(cache, output, "--offload_models",
                                                  f"{PATTERN['text_encoder']},{PATTERN['vae']}", *extra))


def prompt_embedding(cache, index):
    (path,) = [path for path in list_cache_files(cache) if path.stem == str(index)]
    return load_cache_sample(path)["posi"]["prompt_emb"]


def test_a_fixed_caption_is_recomputed_and_nothing_else(dataset, tmp_path, capsys):
    cache = tmp_path / "cache"
    assert stage_one(dataset, cache)["cached"] == 4
    assert "0 cached, 4 new" in capsys.readouterr().out
    old = prompt_embedding(cache, 1)
    untouched = {path.name: path.stat().st_mtime_ns for path in list_cache_files(cache)}
    rows = read_rows(dataset)
    rows[1] = (rows[1][0], "a corrected caption that says something else entirely")
    write_rows(dataset, rows)
    assert stage_one(dataset, cache)["cached"] == 1
    assert "3 cached, 1 changed (row), 0 new" in capsys.readouterr().out
    # The new embedding is the one a fresh stage 1 computes from the fixed metadata.
    assert stage_one(dataset, tmp_path / "fresh")["cached"] == 4
    new = prompt_embedding(cache, 1)
    assert torch.equal(new, prompt_embedding(tmp_path / "fresh", 1)) and not torch.equal(new, old)
    again = {path.name: path.stat().st_mtime_ns for path in list_cache_files(cache)}
    assert [name for name in untouched if again[name] != untouched[name]] == ["1.safetensors"]


def test_a_shrunk_dataset_leaves_no_orphans(dataset, tmp_path, capsys):
    cache = tmp_path / "cache"
    stage_one(dataset, cache)
    write_rows(dataset, read_rows(dataset)[:2])
    assert stage_one(dataset, cache)["cached"] == 0
    assert "2 cached, 0 new, 2 orphans removed" in capsys.readouterr().out
    assert sorted(path.name for path in list_cache_files(cache)) == ["0.safetensors", "1.safetensors"]
    assert read_cache_manifest(cache)["num_samples"] == 2
    assert stage_two(cache, tmp_path / "out")["global_step"] == 2


def test_a_changed_max_pixels_recomputes_every_sample(dataset, tmp_path, capsys):
    cache = tmp_path / "cache"
    stage_one(dataset, cache)

    def latent_sizes():
        return [load_cache_sample(path)["shared"]["input_latents"].shape[-2:].numel() for path in
                list_cache_files(cache)]

    before = latent_sizes()
    capsys.readouterr()
    assert stage_one(dataset, cache, "--max_pixels", "16384")["cached"] == 4
    assert "0 cached, 4 changed (settings), 0 new" in capsys.readouterr().out
    # Four times the pixel budget: every sample's latent grows (by 3 to 5.5 times, after rounding sides to 16).
    assert all(after >= 3 * size for after, size in zip(latent_sizes(), before, strict=True))


def test_another_stage_one_dtype_recomputes_every_sample(dataset, tmp_path, capsys):
    cache = tmp_path / "cache"
    stage_one(dataset, cache)
    capsys.readouterr()
    assert stage_one(dataset, cache, "--torch_dtype", "bfloat16")["cached"] == 4
    assert "0 cached, 4 changed (models), 0 new" in capsys.readouterr().out
    assert load_cache_sample(list_cache_files(cache)[0])["posi"]["prompt_emb"].dtype == torch.bfloat16


def test_stage_two_refuses_an_incomplete_cache_unless_partial_is_allowed(dataset, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    stage_one(dataset, cache)
    for path in list_cache_files(cache)[1:3]:
        path.unlink()
    from diffsynth.core.loader import loading

    with monkeypatch.context() as patch:
        patch.setattr(loading, "load_model_from_files", lambda *a, **k: pytest.fail("a model was loaded"))
        with pytest.raises(CacheError) as error:
            stage_two(cache, tmp_path / "out")
    message = str(error.value)
    assert "2 of its 4 samples are missing" in message and "--allow_partial_cache" in message
    assert "--task sft:data_process" in message and str(cache) in message and str(dataset) in message
    result = stage_two(cache, tmp_path / "out", "--allow_partial_cache")
    assert result["global_step"] == 2


def make_damaged(dataset):
    """Row 3 of the dataset names a PNG whose body is cut off; its header still reads."""
    image = dataset / read_rows(dataset)[2][0]
    Image.effect_noise((128, 128), 64).convert("RGB").save(image)
    image.write_bytes(image.read_bytes()[:400])
    return image.name


def one_stage(dataset, output, *extra):
    reset_accelerate_state()
    return main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(output), *extra])


def test_a_truncated_image_stops_the_run_at_start_up_naming_row_and_file(dataset, tmp_path, monkeypatch):
    from diffsynth.core.loader import loading

    name = make_damaged(dataset)
    monkeypatch.setattr(loading, "load_model_from_files", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(DatasetError) as error:
        one_stage(dataset, tmp_path / "out")
    assert "row 3" in str(error.value) and name in str(error.value) and "--on_bad_sample skip" in str(error.value)
    assert not (tmp_path / "out").exists()


def test_skip_trains_on_the_rest_and_counts_the_skipped_sample(dataset, tmp_path, caplog):
    make_damaged(dataset)
    result = one_stage(dataset, tmp_path / "out", "--on_bad_sample", "skip")
    assert result["skipped_samples"] == 1 and result["global_step"] == 3
    assert "1 of 4 samples skipped at start-up" in caplog.text and "row 3" in caplog.text


def test_on_first_touch_stop_names_the_row_and_skip_keeps_every_step(dataset, tmp_path, monkeypatch, caplog):
    # A dataset above the start-up budget: files are decoded only when the run reads them.
    monkeypatch.setattr(startup_dataset, "STARTUP_DECODE_PIXELS", 0)
    name = make_damaged(dataset)
    with pytest.raises(DatasetError) as error:
        one_stage(dataset, tmp_path / "stopped")
    assert "row 3" in str(error.value) and name in str(error.value)
    result = one_stage(dataset, tmp_path / "out", "--on_bad_sample", "skip", "--num_epochs", "2")
    # Replaced by the next readable row, so each epoch keeps its four steps; the sample is skipped once per epoch.
    assert result["global_step"] == 8 and result["skipped_samples"] == 2
    assert "epoch 0: 1 sample(s) skipped" in caplog.text and "epoch 1: 1 sample(s) skipped" in caplog.text


@pytest.mark.parametrize("at_start_up", [True, False])
def test_stage_one_skips_an_undecodable_row_and_stage_two_does_not_count_it_missing(dataset, tmp_path, monkeypatch,
                                                                                 capsys, at_start_up):
    if not at_start_up:
        monkeypatch.setattr(startup_dataset, "STARTUP_DECODE_PIXELS", 0)
    make_damaged(dataset)
    cache = tmp_path / "cache"
    assert stage_one(dataset, cache, "--on_bad_sample", "skip")["cached"] == 3
    # Found at start-up the row is never planned; found on first touch it was planned as new, then skipped.
    new = 3 if at_start_up else 4
    assert f"0 cached, {new} new, 1 skipped (undecodable)" in capsys.readouterr().out
    assert sorted(read_cache_manifest(cache)["skipped"]) == [2]
    assert stage_two(cache, tmp_path / "out")["global_step"] == 3


def test_a_truncated_video_stops_a_wan_run_at_start_up(tmp_path, monkeypatch):
    from diffsynth.core.data.example_dataset import build_example_video_dataset
    from diffsynth.core.loader import loading
    from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
    from tests.training.test_trainer_wan import COMMON as WAN_COMMON

    folder = tmp_path / "videos"
    build_example_video_dataset(folder, num_videos=2, num_frames=6)
    clip = folder / "video_001.gif"
    clip.write_bytes(clip.read_bytes()[: clip.stat().st_size * 7 // 10])
    monkeypatch.setattr(loading, "load_model_from_files", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(DatasetError) as error:
        main(WanVideoPipeline, [*raw(folder), *WAN_COMMON, "--output_path", str(tmp_path / "out")], video=True)
    assert "row 2" in str(error.value) and "video_001.gif" in str(error.value)


def test_the_flags_are_checked_against_the_task(dataset, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(tmp_path), "--allow_partial_cache"])
    assert "--allow_partial_cache applies to the stage-1 cache" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(QwenImagePipeline, stage_two_argv(tmp_path, tmp_path / "out", "--on_bad_sample", "skip"))
    assert "--on_bad_sample skip has no effect on --task sft:train" in capsys.readouterr().err


def test_two_stage_training_still_gives_the_one_stage_lora_from_a_resumed_cache(dataset, tmp_path):
    cache = tmp_path / "cache"
    stage_one(dataset, cache)
    list_cache_files(cache)[2].unlink()
    assert stage_one(dataset, cache)["cached"] == 1
    stage_two(cache, tmp_path / "two")
    one_stage(dataset, tmp_path / "one")
    first = load_file(str(tmp_path / "one" / "epoch-0.safetensors"))
    second = load_file(str(tmp_path / "two" / "epoch-0.safetensors"))
    assert first.keys() == second.keys()
    assert max((first[key] - second[key]).abs().max().item() for key in first) < 1e-6


def test_two_processes_agree_on_skipped_samples_in_stage_one_and_in_training(dataset, tmp_path, tiny_root):
    """Stage 1 with the bad row found at start-up by one process and shared; training with it found on first touch
    by the process that reads it, every process keeping its step count."""
    make_damaged(dataset)
    script = tmp_path / "run.py"
    script.write_text(
        "import json, sys, torch\n"
        "from diffsynth.training import entry as trainer\n"
        "from diffsynth.training.startup import dataset as startup_dataset\n"
        "from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline\n"
        "from tests.conftest import reset_accelerate_state\n"
        "cache, output, flags = sys.argv[1], sys.argv[2], sys.argv[3:]\n"
        "staged = trainer.main(QwenImagePipeline, [*flags, '--output_path', cache, '--task', 'sft:data_process'])\n"
        "reset_accelerate_state()\n"
        "startup_dataset.STARTUP_DECODE_PIXELS = 0  # files are decoded when first read\n"
        "trained = trainer.main(QwenImagePipeline, [*flags, '--output_path', output])\n"
        "rank = torch.distributed.get_rank()\n"
        "total = sum(float(w.double().sum()) for w in trained['module'].trainable_state_dict().values())\n"
        "result = {'rank': rank, 'cached': staged['cached'], 'steps': trained['global_step'],\n"
        "          'skipped': trained['skipped_samples'], 'sum': total}\n"
        "open(f'{output}.result-{rank}.json', 'w').write(json.dumps(result))\n"
    )
    cache, output = tmp_path / "cache", tmp_path / "out"
    flags = [*raw(dataset), *COMMON, "--on_bad_sample", "skip"]
    command = [*accelerate_launch(2), str(script), str(cache),
               str(output), *flags]
    # The launched processes import this checkout (and its tests package), as this process does.
    env = {**os.environ, "DIFFSYNTH_MODEL_BASE_PATH": str(tiny_root), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # Each rank writes its own file: two processes printing to one pipe can interleave their lines.
    results = [json.loads((tmp_path / f"out.result-{rank}.json").read_text()) for rank in (0, 1)]
    assert [result["cached"] for result in results] == [1, 2]  # rank 0: row 1 (row 3 skipped); rank 1: rows 2, 4
    assert "stage 1: 0 cached, 3 new, 1 skipped (undecodable)" in done.stdout
    assert sorted(read_cache_manifest(cache)["skipped"]) == [2]
    assert sorted((path.parent.name, path.stem) for path in list_cache_files(cache)) == [("0", "0"), ("1", "1"),
                                                                                         ("1", "3")]
    # Four rows over two processes: two steps each, the bad row replaced where it fell, weights identical.
    assert [(result["steps"], result["skipped"]) for result in results] == [(2, 1), (2, 1)]
    assert results[0]["sum"] == results[1]["sum"]
    assert "epoch 0: 1 sample(s) skipped" in done.stderr
