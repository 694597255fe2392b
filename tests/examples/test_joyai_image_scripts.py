"""The reference's JoyAI-Image-Edit commands (DiffSynth-Studio fed7b18, ``examples/joyai_image/model_training``) run
as written on the tiny repo through the trainer's ``main``: each script caches the encoders' outputs
(``sft:data_process``) and then trains the transformer on the cache (``sft:train``).

Each ``accelerate launch`` command runs from a scratch working folder with only what a user on a small machine would
change: the dataset (drawn at the path the script names, with one edit image per sample), sizes, epochs and repeats,
and ``DIFFSYNTH_MODEL_BASE_PATH`` pointing at the tiny repos.
"""

from __future__ import annotations

import functools

import torch
from safetensors.torch import load_file

from diffsynth.pipelines.joyai_image.pipeline import JoyAIImagePipeline
from tests.examples.helpers import draw_dataset, lora_update, run_command, script_commands

from .test_scripts import REPO

JOYAI = REPO / "examples" / "joyai_image" / "model_training"
DRAW = functools.partial(draw_dataset, edit_inputs="edit_image")


def test_the_lora_script_caches_then_trains_the_named_layers(workdir):
    (_, cache), (_, train) = script_commands(JOYAI, "lora/JoyAI-Image-Edit.sh")
    first = run_command(JoyAIImagePipeline, cache, draw=DRAW)
    assert first["cached"] == 2
    result = run_command(JoyAIImagePipeline, train, draw=DRAW)
    assert result["global_step"] == 2 and all(torch.isfinite(torch.tensor(result["losses"])))
    path = workdir / "models/train/JoyAI-Image-Edit-lora/epoch-0.safetensors"
    weights = load_file(str(path))
    # The four layers the script names in each of the 2 blocks, under the JoyAI code's names.
    assert len([key for key in weights if "lora_B" in key]) == 2 * 4 and lora_update(path) > 0
    assert any(key.startswith("diffusion_model.double_blocks.0.img_attn_qkv.") for key in weights)
    twin = load_file(str(path.with_name("epoch-0.diffusers.safetensors")))
    assert "transformer.double_blocks.0.attn.img_attn_qkv.lora_A.weight" in twin


def test_the_full_script_trains_the_transformer(workdir):
    (_, cache), (config, train) = script_commands(JOYAI, "full/JoyAI-Image-Edit.sh")
    assert config.name == "accelerate_config_zero3.yaml"
    run_command(JoyAIImagePipeline, cache, draw=DRAW)
    result = run_command(JoyAIImagePipeline, train, draw=DRAW)
    assert result["global_step"] > 0 and all(torch.isfinite(torch.tensor(result["losses"])))
    assert (workdir / "models/train/JoyAI-Image-Edit-full/epoch-0.safetensors").is_file()
