"""The reference's LTX-2.3 scripts run as written on the tiny repos they name (``DiffSynth-Studio/LTX-2.3-Repackage``'s
transformer, per-stream text connectors and VAE encoders, Gemma-3's release), through
the trainer's ``main``, with the sizes, frames, epochs and repeats made small: LoRA text-to-audio+video, image-to-
audio+video (``--extra_inputs input_audio,input_image``) and IC-LoRA, and the full runs of both. Each LoRA loads
fully into diffusers' pipeline of the tiny LTX-2.3 and changes its output; each full run writes the whole
transformer, which loads back into it.
"""

from __future__ import annotations

import shlex

import pytest
import torch
from safetensors.torch import load_file

from diffsynth.core.data.cache import list_cache_files, load_cache_sample
from diffsynth.core.data.example_dataset import build_example_video_dataset
from diffsynth.pipelines.ltx2 import LTX2AudioVideoPipeline
from diffsynth.testing.tiny_ltx23 import LTX23_MODEL_ID
from diffsynth.training.config.parsers import build_parser
from tests.examples.helpers import lora_update, run_command, script_commands
from tests.examples.test_ltx2_ic_script import draw_references
from tests.examples.test_ltx2_scripts import CHANGES, LTX2

pytestmark = pytest.mark.slow  # trainer runs on the tiny repos

ZERO2 = "examples/qwen_image/model_training/full/accelerate_config_zero2offload.yaml"


def draw_clips(argv: list[str]) -> None:
    """Two clips with sound at the path a raw-data command names."""
    args = build_parser(video=True).parse_args(argv)
    if not args.task.endswith(":train"):
        build_example_video_dataset(args.dataset_base_path, num_videos=2, num_frames=6, audio=True)


def run_script(relative: str, draw=draw_clips) -> list[dict]:
    return [run_command(LTX2AudioVideoPipeline, argv, draw, video=True)
            for _, argv in script_commands(LTX2, relative, CHANGES)]


def cached(workdir, folder: str) -> list[dict]:
    return [load_cache_sample(path)["shared"] for path in list_cache_files(workdir / "models/train" / folder)]


def assert_loads_in_diffusers(model_root, path, pipeline: str = "LTX2Pipeline") -> None:
    """The LoRA loads into diffusers' pipeline of the tiny LTX-2.3 with no unmatched key, one adapter layer per pair
    of the file."""
    import diffusers

    from tests.conftest import load_lora_into_diffusers

    pipe = getattr(diffusers, pipeline).from_pretrained(str(model_root / LTX23_MODEL_ID), dtype=torch.float32)
    assert load_lora_into_diffusers(pipe, path, "script") == []
    loaded = [name for name, _ in pipe.transformer.named_parameters() if "lora_A" in name]
    assert len(loaded) == len([key for key in load_file(str(path)) if "lora_A" in key])


def test_the_t2av_lora_script_trains_on_the_sound_and_loads_in_diffusers(workdir, model_root):
    stage_one, stage_two = run_script("lora/LTX-2.3-T2AV-splited.sh")
    assert stage_one["cached"] == 2 and stage_two["global_step"] == 2
    pipe = stage_two["module"].pipe
    assert pipe.model_configs["dit"].model_id == "DiffSynth-Studio/LTX-2.3-Repackage" and pipe.dit.config.gated_attn
    # stage 1 cached the sound, and each stream's prompt tokens at its own width (2.3's per-stream projections)
    for path in list_cache_files(workdir / "models/train/LTX2.3-T2AV_lora-splited-cache"):
        sample = load_cache_sample(path)
        assert sample["shared"]["trains_audio"]
        assert (sample["posi"]["prompt_emb"].shape[-1], sample["posi"]["audio_prompt_emb"].shape[-1]) == (16, 8)
    path = workdir / "models/train/LTX2.3-T2AV_lora/epoch-0.safetensors"
    assert lora_update(path) > 0 and all(key.startswith("diffusion_model.") for key in load_file(str(path)))
    assert_loads_in_diffusers(model_root, path)


def test_the_i2av_lora_script_caches_the_first_frame(workdir, model_root):
    stage_one, stage_two = run_script("lora/LTX-2.3-I2AV-splited.sh")
    assert stage_one["cached"] == 2 and stage_two["global_step"] == 2
    for shared in cached(workdir, "LTX2.3-I2AV_lora-splited-cache"):
        assert shared["first_frame_latents"].shape == (1, 8, 1, 16, 16)
    path = workdir / "models/train/LTX2.3-I2AV_lora/epoch-0.safetensors"
    assert lora_update(path) > 0
    assert_loads_in_diffusers(model_root, path, "LTX2ImageToVideoPipeline")


def test_the_ic_lora_script_caches_the_references_and_loads_in_diffusers(workdir, model_root):
    stage_one, stage_two = run_script("lora/LTX-2.3-T2AV-IC-LoRA-splited.sh", draw_references)
    assert stage_one["cached"] == 2 and stage_two["global_step"] == 2
    for shared in cached(workdir, "LTX2.3-T2AV-IC-LoRA-splited-cache"):
        assert shared["in_context_latents"].shape == (1, 3 * 8 * 8, 8)
    path = workdir / "models/train/LTX2.3-T2AV-IC-LoRA/epoch-0.safetensors"
    assert lora_update(path) > 0
    assert_loads_in_diffusers(model_root, path, "LTX2InContextPipeline")


@pytest.mark.parametrize("script", ["full/LTX-2.3-T2AV-splited.sh", "full/LTX-2.3-I2AV-splited.sh"])
def test_the_full_scripts_train_the_whole_transformer(workdir, model_root, script):
    configs = [config for config, _ in script_commands(LTX2, script, CHANGES)]
    assert configs == [None, LTX2.parents[2] / ZERO2], [shlex.quote(str(config)) for config in configs]
    _, result = run_script(script)
    name = "LTX2.3-T2AV-full" if "T2AV" in script else "LTX2.3-I2AV-full"
    saved = load_file(str(workdir / "models/train" / name / "epoch-0.safetensors"))
    assert set(saved) == set(result["module"].pipe.dit.state_dict()) and result["global_step"] == 2
    from diffusers import LTX2VideoTransformer3DModel

    start = LTX2VideoTransformer3DModel.from_pretrained(str(model_root / LTX23_MODEL_ID), subfolder="transformer")
    start.load_state_dict(saved)  # the whole transformer, under diffusers' names
    assert any(not torch.equal(saved[key], value) for key, value in
               LTX2VideoTransformer3DModel.from_pretrained(str(model_root / LTX23_MODEL_ID),
                                                          subfolder="transformer").state_dict().items())


def test_the_joyai_echo_lora_script_trains_from_the_one_release_file(workdir, model_root):
    stage_one, stage_two = run_script("lora/JoyAI-Echo-T2AV-splited.sh")
    assert stage_one["cached"] == 2 and stage_two["global_step"] == 2
    # stage 2 named the release file alone: it gave the transformer (and the other models it holds)
    pipe = stage_two["module"].pipe
    assert pipe.model_configs["dit"].model_id == "jd-opensource/JoyAI-Echo" and pipe.dit.config.gated_attn
    for shared in cached(workdir, "JoyAI-Echo-T2AV_lora-splited-cache"):
        assert shared["trains_audio"]
    path = workdir / "models/train/JoyAI-Echo-T2AV_lora/epoch-0.safetensors"
    assert lora_update(path) > 0 and all(key.startswith("diffusion_model.") for key in load_file(str(path)))
    assert_loads_in_diffusers(model_root, path)


def test_the_joyai_echo_full_script_trains_the_whole_transformer(workdir):
    configs = [config for config, _ in script_commands(LTX2, "full/JoyAI-Echo-T2AV-splited.sh", CHANGES)]
    assert configs == [None, LTX2.parents[2] / ZERO2]
    _, result = run_script("full/JoyAI-Echo-T2AV-splited.sh")
    saved = load_file(str(workdir / "models/train/JoyAI-Echo-T2AV-full/epoch-0.safetensors"))
    assert set(saved) == set(result["module"].pipe.dit.state_dict()) and result["global_step"] == 2
