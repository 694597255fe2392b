"""The CLI trainer on the tiny LTX-2 and a generated dataset with sound (``video,prompt,input_audio``: a clip's own
sound track and a ``.wav``): a LoRA run that trains on the sound, the split run whose stage-1 cache holds the audio
latents, and samples written as an ``.mp4`` with its sound and a ``.wav``. The family kit
(``tests/pipelines/test_family_kit.py``) runs the generic checks on a dataset without sound."""

import json
import wave

import av
import numpy as np
import pytest
import torch

from diffsynth.core.data.cache import list_cache_files, load_cache_sample
from diffsynth.core.data.example_dataset import build_example_video_dataset
from diffsynth.pipelines.ltx2 import LTX2AudioVideoPipeline
from diffsynth.testing.tiny_ltx2 import LTX2_MODEL_ID, LTX2_PATTERNS
from diffsynth.training.entry import main
from tests.core.test_quant import needs_bitsandbytes
from tests.training.conftest import assert_trained, lora, max_difference, run_once

ENCODERS = ("text_encoder", "connectors", "vae", "audio_vae")
MODELS = {slot: f"{LTX2_MODEL_ID}:{LTX2_PATTERNS[slot]}" for slot in ("dit", *ENCODERS, "vocoder")}
COMMON = [
    "--lora_base_model", "dit", "--lora_target_modules", "to_k,to_q,to_v,to_out.0", "--lora_rank", "4",
    "--learning_rate", "1e-3", "--torch_dtype", "float32", "--seed", "3", "--height", "32", "--width", "32",
    "--num_frames", "5", "--num_epochs", "1", "--data_file_keys", "video,input_audio", "--extra_inputs",
    "input_audio", "--remove_prefix_in_ckpt", "pipe.dit.", "--use_gradient_checkpointing",
]  # fmt: skip

pytestmark = pytest.mark.slow  # trainer runs on the tiny repos


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("av")
    build_example_video_dataset(folder, num_videos=2, num_frames=6, audio=True)
    return folder


def train(argv):
    return main(LTX2AudioVideoPipeline, argv, video=True)


def models(*slots):
    return ["--model_id_with_origin_paths", ",".join(MODELS[slot] for slot in slots)]


def raw(folder):
    return ["--dataset_base_path", str(folder), "--dataset_metadata_path", str(folder / "metadata.csv")]


@pytest.fixture(scope="module")
def one_stage(clips, tiny_root, tmp_path_factory):
    folder = tmp_path_factory.mktemp("one_stage")
    return run_once(tiny_root, folder, lambda output: train(
        [*raw(clips), *models("dit", *ENCODERS), *COMMON, "--output_path", str(output)]))


def test_a_run_with_sound_trains_on_it(one_stage, clips, tiny_root, tmp_path):
    output, result = one_stage
    assert_trained(result, 2)
    # Without the sound column the same clips give another LoRA: the sound is in the loss.
    silent = tmp_path / "silent"
    silent.mkdir()
    for path in clips.glob("video_*.mp4"):
        (silent / path.name).symlink_to(path)
    (silent / "metadata.csv").write_text("video,prompt\n" + "".join(
        f"{line.split(',')[0]},{line.split(',')[1]}\n" for line in (clips / "metadata.csv").read_text().splitlines()[1:]))
    argv = [arg for arg in COMMON if arg not in ("--data_file_keys", "video,input_audio", "--extra_inputs",
                                                   "input_audio")]
    video_only, video_result = run_once(tiny_root, tmp_path, lambda out: train(
        [*raw(silent), *models("dit", *ENCODERS), *argv, "--output_path", str(out)]))
    assert_trained(video_result, 2)
    assert max_difference(lora(video_only, "epoch-0"), lora(output, "epoch-0")) > 1e-5


def test_the_split_run_caches_the_audio_latents_and_trains_the_one_stage_lora(one_stage, clips, tiny_root,
                                                                               tmp_path):
    cache, split = tmp_path / "cache", tmp_path / "split"
    run_once(tiny_root, tmp_path, lambda _: train(
        [*raw(clips), *models(*ENCODERS), *COMMON, "--task", "sft:data_process", "--output_path", str(cache)]))
    files = list_cache_files(cache)
    assert len(files) == 2
    for path in files:
        shared = load_cache_sample(path)["shared"]
        latents, tokens = shared["input_latents"], shared["video_tokens"]
        assert shared["trains_audio"] and latents.shape[1] == tokens + shared["audio_frames"]
        assert latents[:, tokens:].abs().max() > 0.1  # the sound's latents, not the silent zeros
    run_once(tiny_root, tmp_path, lambda _: train(
        ["--dataset_base_path", str(cache), *models("dit"), *COMMON, "--task", "sft:train", "--output_path",
         str(split)]))
    assert max_difference(lora(split, "epoch-0"), lora(one_stage[0], "epoch-0")) < 1e-5


def test_samples_are_written_with_their_sound(clips, tiny_root, tmp_path):
    (tmp_path / "prompts.json").write_text(json.dumps([{"prompt": "a bell", "num_frames": 5, "fps": 25, "seed": 1}]))
    output, _ = run_once(tiny_root, tmp_path, lambda out: train(
        [*raw(clips), *models("dit", *ENCODERS, "vocoder"), *COMMON, "--validation_prompts",
         str(tmp_path / "prompts.json"), "--validation_num_inference_steps", "2", "--validation_epochs", "1", "--output_path", str(out)]))
    folder = output / "samples" / "step-2"
    assert sorted(path.name for path in folder.iterdir()) == ["00.mp4", "00.wav"]
    with av.open(str(folder / "00.mp4")) as container:
        assert len(container.streams.video) == 1 and len(container.streams.audio) == 1
        assert container.streams.video[0].average_rate == 25
        sound = np.concatenate([frame.to_ndarray() for frame in container.decode(audio=0)], axis=1)
    with wave.open(str(folder / "00.wav")) as file:
        rate, channels, samples = file.getframerate(), file.getnchannels(), file.getnframes()
    # The vocoder's stereo waveform at its rate, in the .wav and (AAC pads whole blocks) in the video's track.
    assert (rate, channels) == (16000, 2) and samples > 0
    assert sound.shape[0] == 2 and sound.shape[1] >= samples and np.isfinite(sound).all()


def test_an_fp8_transformer_trains_the_lora_of_the_full_precision_one_closely(one_stage, clips, tiny_root, tmp_path):
    output, result = one_stage
    fp8, fp8_result = run_once(tiny_root, tmp_path, lambda out: train(
        [*raw(clips), *models("dit", *ENCODERS), *COMMON, "--fp8_models", MODELS["dit"], "--output_path", str(out)]))
    assert fp8_result["module"].pipe.dit.transformer_blocks[0].attn1.to_q.base_layer.weight.dtype == torch.float8_e4m3fn
    assert_trained(fp8_result, 2)
    # About 2.5% weight error: the losses stay within a few percent, and the LoRA moves the same way.
    assert all(abs(a - b) < 0.05 * b for a, b in zip(fp8_result["losses"], result["losses"]))
    assert 0 < max_difference(lora(fp8, "epoch-0"), lora(output, "epoch-0")) < 1e-2


def test_image_to_audio_video_training_runs_split_as_in_one_stage(one_stage, clips, tiny_root, tmp_path):
    i2av = [*COMMON[:COMMON.index("input_audio")], "input_audio,input_images",
            *COMMON[COMMON.index("input_audio") + 1:]]
    output, result = run_once(tiny_root, tmp_path / "one", lambda out: train(
        [*raw(clips), *models("dit", *ENCODERS), *i2av, "--output_path", str(out)]))
    assert_trained(result, 2)
    assert max_difference(lora(output, "epoch-0"), lora(one_stage[0], "epoch-0")) > 1e-5  # the first frame is given
    cache = tmp_path / "cache"
    run_once(tiny_root, tmp_path, lambda _: train(
        [*raw(clips), *models(*ENCODERS), *i2av, "--task", "sft:data_process", "--output_path", str(cache)]))
    assert all("first_frame_latents" in load_cache_sample(path)["shared"] for path in list_cache_files(cache))
    split, _ = run_once(tiny_root, tmp_path / "two", lambda out: train(
        ["--dataset_base_path", str(cache), *models("dit"), *i2av, "--task", "sft:train", "--output_path", str(out)]))
    assert max_difference(lora(split, "epoch-0"), lora(output, "epoch-0")) < 1e-5


@needs_bitsandbytes
def test_an_nf4_transformer_trains_a_lora_close_to_the_full_precision_one(one_stage, clips, tiny_root, tmp_path):
    import bitsandbytes as bnb

    output, result = one_stage
    nf4, nf4_result = run_once(tiny_root, tmp_path, lambda out: train(
        [*raw(clips), *models("dit", *ENCODERS), *COMMON, "--quant_options", f"{MODELS['dit']}:bitsandbytes_nf4",
         "--output_path", str(out)]))
    assert isinstance(nf4_result["module"].pipe.dit.transformer_blocks[0].attn1.to_q.base_layer, bnb.nn.Linear4bit)
    assert_trained(nf4_result, 2)
    # About 9% weight error: the losses stay within a few percent, and the LoRA moves the way the bf16 one does.
    assert all(abs(a - b) < 0.05 * b for a, b in zip(nf4_result["losses"], result["losses"]))
    assert 0 < max_difference(lora(nf4, "epoch-0"), lora(output, "epoch-0")) < 2e-2


def test_clips_with_and_without_sound_share_batches_as_accumulation_trains_them(clips, tiny_root, tmp_path):
    """A row whose input_audio cell is empty trains its video alone, in a batch of two as with accumulation, and in
    a split run from the cache."""
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for path in clips.glob("*.*"):
        (mixed / path.name).symlink_to(path)
    header, with_sound, without = (clips / "metadata.csv").read_text().splitlines()
    (mixed / "metadata.csv").write_text(f"{header}\n{with_sound}\n{without.rsplit(',', 1)[0]},\n")
    argv = [*models("dit", *ENCODERS), *COMMON]
    accumulated, accumulated_result = run_once(tiny_root, tmp_path / "accumulated", lambda out: train(
        [*raw(mixed), *argv, "--aspect_ratio_buckets", "--gradient_accumulation_steps", "2", "--output_path",
         str(out)]))
    batched, batched_result = run_once(tiny_root, tmp_path / "batched", lambda out: train(
        [*raw(mixed), *argv, "--batch_size", "2", "--output_path", str(out)]))
    assert_trained(batched_result, 1)
    assert batched_result["losses"] == pytest.approx(accumulated_result["losses"], abs=2e-5)
    assert max_difference(lora(batched, "epoch-0"), lora(accumulated, "epoch-0")) < 2e-5
    cache = tmp_path / "cache"
    run_once(tiny_root, tmp_path, lambda _: train(
        [*raw(mixed), *models(*ENCODERS), *COMMON, "--batch_size", "2", "--task", "sft:data_process",
         "--output_path", str(cache)]))
    flags = sorted(load_cache_sample(path)["shared"]["trains_audio"].item() for path in list_cache_files(cache))
    assert flags == [False, True]
    split, _ = run_once(tiny_root, tmp_path / "split", lambda out: train(
        ["--dataset_base_path", str(cache), *models("dit"), *COMMON, "--batch_size", "2", "--task", "sft:train",
         "--output_path", str(out)]))
    assert max_difference(lora(split, "epoch-0"), lora(batched, "epoch-0")) < 2e-5


def test_frame_rate_sets_the_rows_without_one_and_a_new_rate_recomputes_the_cache(clips, tiny_root, tmp_path):
    folder = tmp_path / "rates"
    folder.mkdir()
    for path in clips.glob("*.*"):
        (folder / path.name).symlink_to(path)
    header, first, second = (clips / "metadata.csv").read_text().splitlines()
    (folder / "metadata.csv").write_text(f"{header},frame_rate\n{first},25\n{second},\n")  # the second row has none
    cache = tmp_path / "cache"

    def cached_rates(*flags):
        run_once(tiny_root, tmp_path, lambda _: train(
            [*raw(folder), *models(*ENCODERS), *COMMON, *flags, "--task", "sft:data_process", "--output_path",
             str(cache)]))
        shared = [load_cache_sample(path)["shared"] for path in sorted(list_cache_files(cache))]
        for state in shared:  # the sound is cut to the clip's seconds at its rate (the tiny audio VAE's is 16 kHz)
            assert state["audio_frames"] == LTX2AudioVideoPipeline().audio_frames(5, state["frame_rate"])
        return [state["frame_rate"] for state in shared]

    assert cached_rates("--frame_rate", "12") == [25.0, 12.0]
    assert cached_rates() == [25.0, 24.0]  # the reference's default; the flag's change recomputed the row
