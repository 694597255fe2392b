"""The LTX-2 example scripts run as written on the tiny repos they name (``DiffSynth-Studio/LTX-2-Repackage``'s
transformer, text connectors and VAE encoders, Gemma-3's release), through the trainer's ``main``.

Each ``accelerate launch`` command runs in this process from a scratch working folder, with only what a user on a
small machine would change: the sizes, the frame count, the epochs and the dataset's repeat count, and
``DIFFSYNTH_MODEL_BASE_PATH`` pointing at the tiny repos. The dataset is drawn at the path the script names, with
sound where the command reads ``input_audio``. A LoRA trained on sound loads fully into diffusers' ``LTX2Pipeline``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from diffsynth.core.data.cache import list_cache_files, load_cache_sample
from diffsynth.core.data.example_dataset import build_example_video_dataset
from diffsynth.pipelines.ltx2 import LTX2AudioVideoPipeline
from diffsynth.training.config.parsers import build_parser
from tests.examples.helpers import lora_update, run_command, script_commands

from .test_scripts import REPO

LTX2 = REPO / "examples" / "ltx2" / "model_training"
CHANGES = {"--num_frames": "5"}

pytestmark = pytest.mark.slow  # trainer runs on the tiny repo


def draw_clips(argv: list[str]) -> None:
    """Two clips at the path a raw-data command names, with sound when it reads ``input_audio``."""
    args = build_parser(video=True).parse_args(argv)
    if args.task.endswith(":train") or Path(args.dataset_metadata_path).is_file():
        return
    build_example_video_dataset(args.dataset_base_path, num_videos=2, num_frames=6,
                                audio=args.extra_inputs == "input_audio")


def run_script(relative: str) -> list[dict]:
    results = []
    for config, argv in script_commands(LTX2, relative, CHANGES):
        assert config is None
        results.append(run_command(LTX2AudioVideoPipeline, argv, draw_clips, video=True))
    return results


def test_the_split_lora_script_trains_on_the_sound_and_loads_in_diffusers(workdir, model_root):
    stage_one, stage_two = run_script("lora/LTX-2-T2AV-splited.sh")
    assert stage_one["cached"] == 2 and stage_two["global_step"] == 2
    # stage 1 read the Repackage connectors and VAE encoders (each VAE without the decoder it never calls) and Gemma's
    # release as the script names them, and cached the sound; stage 2 the transformer
    samples = [load_cache_sample(path)["shared"]
               for path in list_cache_files(workdir / "models/train/LTX2-T2AV_lora-splited-cache")]
    assert len(samples) == 2 and all(sample["trains_audio"] for sample in samples)
    assert stage_two["module"].pipe.model_configs["dit"].model_id == "DiffSynth-Studio/LTX-2-Repackage"
    path = workdir / "models/train/LTX2-T2AV_lora/epoch-0.safetensors"
    assert lora_update(path) > 0 and all(key.startswith("diffusion_model.") for key in load_file(str(path)))
    from diffusers import LTX2Pipeline

    from tests.conftest import load_lora_into_diffusers

    pipe = LTX2Pipeline.from_pretrained(str(model_root / "Lightricks/LTX-2"), dtype=torch.float32)
    assert load_lora_into_diffusers(pipe, path, "script") == []
    assert len([name for name, _ in pipe.transformer.named_parameters() if "lora_A" in name]) == len(
        [key for key in load_file(str(path)) if "lora_A" in key])


def test_the_no_audio_script_trains_the_video_alone(workdir):
    stage_one, stage_two = run_script("lora/LTX-2-T2AV-noaudio.sh")
    # the audio VAE encoder is loaded, as the script names it, but no sample gives sound: none is scored
    assert stage_one["cached"] == 2 and not any(
        load_cache_sample(path)["shared"]["trains_audio"]
        for path in list_cache_files(workdir / "models/train/LTX2-T2AV-noaudio_lora-splited-cache"))
    assert stage_two["global_step"] == 2 and all(torch.isfinite(torch.tensor(stage_two["losses"])))
    assert lora_update(workdir / "models/train/LTX2-T2AV-noaudio_lora/epoch-0.safetensors") > 0


def test_the_full_script_trains_the_transformer(workdir, model_root):
    _, result = run_script("full/LTX-2-T2AV-splited.sh")
    saved = load_file(str(workdir / "models/train/LTX2-T2AV_full/epoch-0.safetensors"))
    original = result["module"].pipe.dit.state_dict()
    assert set(saved) == set(original) and result["global_step"] == 2
