"""The CLI trainer on the tiny LTX-2.3 (``diffusers/LTX-2.3-Diffusers``: gated and modulated attention, per-stream
prompt tokens) with a dataset with sound: image-to-audio+video LoRA training in one stage equals the split run, whose
cache holds each stream's prompt tokens at its own width; ``--extra_inputs input_image`` (the reference's name) gives
the first frame as ``input_images`` does. The reference's LTX-2.3 scripts (``tests/examples/test_ltx23_scripts.py``)
run the LoRA, IC-LoRA and full trainings as they are written."""

import pytest

from diffsynth.core.data.cache import list_cache_files, load_cache_sample
from diffsynth.core.data.example_dataset import build_example_video_dataset
from diffsynth.pipelines.ltx2 import LTX2AudioVideoPipeline
from diffsynth.testing.tiny_ltx23 import CONNECTOR_SWITCHES, LTX23_MODEL_ID, LTX23_PATTERNS
from diffsynth.training.entry import main
from tests.training.conftest import assert_trained, lora, max_difference, run_once
from tests.training.test_trainer_ltx2 import COMMON, ENCODERS, raw

MODELS = {slot: f"{LTX23_MODEL_ID}:{LTX23_PATTERNS[slot]}" for slot in ("dit", *ENCODERS)}

pytestmark = pytest.mark.slow  # trainer runs on the tiny repo


def train(argv):
    return main(LTX2AudioVideoPipeline, argv, video=True)


def models(*slots):
    return ["--model_id_with_origin_paths", ",".join(MODELS[slot] for slot in slots)]


def i2av(name: str) -> list[str]:
    """The common flags with ``--extra_inputs input_audio,<name>``."""
    at = COMMON.index("input_audio")
    return [*COMMON[:at], f"input_audio,{name}", *COMMON[at + 1:]]


def test_image_to_audio_video_training_runs_split_as_in_one_stage(tiny_root, tmp_path):
    clips = tmp_path / "clips"
    build_example_video_dataset(clips, num_videos=2, num_frames=6, audio=True)
    one_stage, result = run_once(tiny_root, tmp_path / "one", lambda out: train(
        [*raw(clips), *models("dit", *ENCODERS), *i2av("input_images"), "--output_path", str(out)]))
    assert_trained(result, 2)
    cache = tmp_path / "cache"
    run_once(tiny_root, tmp_path, lambda _: train(
        [*raw(clips), *models(*ENCODERS), *i2av("input_image"), "--task", "sft:data_process", "--output_path",
         str(cache)]))
    widths = (CONNECTOR_SWITCHES["video_hidden_dim"], CONNECTOR_SWITCHES["audio_hidden_dim"])
    for path in list_cache_files(cache):
        sample = load_cache_sample(path)
        assert sample["shared"]["trains_audio"] and "first_frame_latents" in sample["shared"]
        assert (sample["posi"]["prompt_emb"].shape[-1], sample["posi"]["audio_prompt_emb"].shape[-1]) == widths
    split, _ = run_once(tiny_root, tmp_path / "two", lambda out: train(
        ["--dataset_base_path", str(cache), *models("dit"), *i2av("input_image"), "--task", "sft:train",
         "--output_path", str(out)]))
    assert max_difference(lora(split, "epoch-0"), lora(one_stage, "epoch-0")) < 1e-5
    # with teeth: text-to-audio+video training on the same clips gives another LoRA (the first frame is given)
    t2av, _ = run_once(tiny_root, tmp_path / "t2av", lambda out: train(
        [*raw(clips), *models("dit", *ENCODERS), *COMMON, "--output_path", str(out)]))
    assert max_difference(lora(t2av, "epoch-0"), lora(one_stage, "epoch-0")) > 1e-5
