"""The CLI trainer on the tiny LTX-2 with an IC-LoRA dataset as the reference's (``metadata.json`` rows with
``in_context_videos``, ``in_context_downsample_factor`` and ``frame_rate``): the references condition the LoRA, the
split run caches their latents and trains the one-stage LoRA, and bad references fail with the fix named."""

import json

import pytest

from diffsynth.core.data.cache import list_cache_files, load_cache_sample
from diffsynth.core.data.example_dataset import build_example_video_dataset
from tests.conftest import reset_accelerate_state
from tests.training.conftest import assert_trained, lora, max_difference, run_once
from tests.training.test_trainer_ltx2 import COMMON, ENCODERS, models, train

KEYS = "video,input_audio,in_context_videos"
EXTRA = "input_audio,in_context_videos,in_context_downsample_factor,frame_rate"
IC = [*COMMON[:COMMON.index("video,input_audio")], KEYS,
      *COMMON[COMMON.index("video,input_audio") + 1:COMMON.index("input_audio")], EXTRA,
      *COMMON[COMMON.index("input_audio") + 1:]]

pytestmark = pytest.mark.slow  # trainer runs on the tiny repos


def write_rows(folder, path=None, **changes):
    """``metadata.json`` (or ``path``) for the clips of ``folder``: each clip with its sound and the other clip as
    its reference (a list in the first row, a single path in the second, both forms the reference reads), at half
    size and 25 fps; returns the dataset flags."""
    rows = []
    for index, line in enumerate((folder / "metadata.csv").read_text().splitlines()[1:]):
        video, prompt, sound = line.split(",")
        other = f"video_{1 - index:03d}.mp4"
        rows.append({"video": video, "prompt": prompt, "input_audio": sound,
                     "in_context_videos": [other] if index == 0 else other, "in_context_downsample_factor": 2,
                     "frame_rate": 25, **changes})
    path = path or folder / "metadata.json"
    path.write_text(json.dumps(rows))
    return ["--dataset_base_path", str(folder), "--dataset_metadata_path", str(path)]


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ic")
    build_example_video_dataset(folder, num_videos=2, num_frames=6, audio=True)
    return folder


@pytest.fixture(scope="module")
def one_stage(clips, tiny_root, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ic_one_stage")
    return run_once(tiny_root, folder, lambda output: train(
        [*write_rows(clips), *models("dit", *ENCODERS), *IC, "--output_path", str(output)]))


def test_the_references_condition_the_lora(one_stage, clips, tiny_root, tmp_path):
    output, result = one_stage
    assert_trained(result, 2)
    plain, plain_result = run_once(tiny_root, tmp_path, lambda out: train(
        [*write_rows(clips), *models("dit", *ENCODERS), *COMMON, "--output_path", str(out)]))
    assert_trained(plain_result, 2)
    assert max_difference(lora(plain, "epoch-0"), lora(output, "epoch-0")) > 1e-5


def test_the_split_run_caches_the_references_and_trains_the_one_stage_lora(one_stage, clips, tiny_root, tmp_path):
    cache, split = tmp_path / "cache", tmp_path / "split"
    run_once(tiny_root, tmp_path, lambda _: train(
        [*write_rows(clips), *models(*ENCODERS), *IC, "--task", "sft:data_process", "--output_path", str(cache)]))
    files = list_cache_files(cache)
    assert len(files) == 2
    for path in files:
        shared = load_cache_sample(path)["shared"]
        # 5 frames at 16x16 (half of 32x32): 3 x 8 x 8 clean tokens, apart from the latents the loss compares.
        assert shared["in_context_latents"].shape == (1, 3 * 8 * 8, 8)
        assert shared["in_context_grids"] == ((3, 8, 8),) and shared["in_context_downsample_factor"] == 2
        assert shared["input_latents"].shape[1] == shared["video_tokens"] + shared["audio_frames"]
    run_once(tiny_root, tmp_path, lambda _: train(
        ["--dataset_base_path", str(cache), *models("dit"), *IC, "--task", "sft:train", "--output_path", str(split)]))
    assert max_difference(lora(split, "epoch-0"), lora(one_stage[0], "epoch-0")) < 1e-5


@pytest.mark.parametrize(("changes", "fragments"), [
    ({"in_context_videos": "missing.mp4"}, ["in_context_videos", "missing.mp4"]),
    ({"in_context_downsample_factor": "two"}, ["in_context_downsample_factor", "two"]),
    ({"in_context_downsample_factor": 0}, ["in_context_downsample_factor", "0"]),
])  # fmt: skip
def test_bad_references_fail_before_any_model_loads(clips, tmp_path, monkeypatch, changes, fragments):
    from diffsynth.core.loader import loading

    monkeypatch.setattr(loading, "load_model_from_files", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises((ValueError, FileNotFoundError)) as error:
        train([*write_rows(clips, **changes), *models("dit", *ENCODERS), *IC, "--output_path", str(tmp_path / "o")])
    assert all(fragment in str(error.value) for fragment in fragments), str(error.value)


def test_a_factor_that_does_not_fit_the_clip_names_the_fix(clips, tiny_root, tmp_path, monkeypatch):
    """Whether a factor fits depends on the VAE's compression, so it is checked on the first sample, before a step."""
    monkeypatch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
    try:
        with pytest.raises(ValueError, match=r"in_context_downsample_factor=3 does not fit a 32x32 clip"):
            train([*write_rows(clips, in_context_downsample_factor=3), *models("dit", *ENCODERS), *IC,
                   "--output_path", str(tmp_path / "out")])
    finally:
        reset_accelerate_state()
    assert not list((tmp_path / "out").glob("*.safetensors"))


def test_batches_of_references_train_what_accumulation_trains(clips, tiny_root, tmp_path):
    """Two clips with same-shaped references share a bucket; their tokens are batched beside the clips'. (Without
    the sound: a sound file's shape is not known before loading it, so sound columns are not batched.)"""
    silent = [{KEYS: "video,in_context_videos", EXTRA: EXTRA.replace("input_audio,", "")}.get(arg, arg) for arg in IC]
    argv = [*write_rows(clips, in_context_videos=["video_000.mp4"]), *models("dit", *ENCODERS), *silent,
            "--num_epochs", "1"]
    accumulated, accumulated_result = run_once(tiny_root, tmp_path / "accumulated", lambda out: train(
        [*argv, "--aspect_ratio_buckets", "--gradient_accumulation_steps", "2", "--output_path", str(out)]))
    batched, batched_result = run_once(tiny_root, tmp_path / "batched", lambda out: train(
        [*argv, "--batch_size", "2", "--output_path", str(out)]))
    assert batched_result["global_step"] == accumulated_result["global_step"] == 1
    assert max_difference(lora(batched, "epoch-0"), lora(accumulated, "epoch-0")) < 1e-5
