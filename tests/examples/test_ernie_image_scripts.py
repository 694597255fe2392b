"""The reference's ERNIE-Image commands (DiffSynth-Studio fed7b18, ``examples/ernie_image/model_training``) run as
written on the tiny repo through the trainer's ``main``, from a scratch working folder with only the dataset (drawn at
the path the script names), sizes, epochs and repeats changed. The full command's DeepSpeed ZeRO-3 config is checked
to be accepted by accelerate rather than launched (a DeepSpeed launch on this CPU costs a JIT build); the command
trains here in-process, as one process.
"""

from __future__ import annotations

import torch

from diffsynth.pipelines.ernie_image.pipeline import ErnieImagePipeline
from tests.examples.helpers import assert_deepspeed_config, lora_update, run_command, script_commands

from .test_scripts import REPO

ERNIE_IMAGE = REPO / "examples" / "ernie_image" / "model_training"


def test_lora_script_trains(workdir):
    [(config, argv)] = script_commands(ERNIE_IMAGE, "lora/ERNIE-Image.sh")
    assert config is None
    result = run_command(ErnieImagePipeline, argv)
    assert result["global_step"] == 2 and all(torch.isfinite(torch.tensor(result["losses"])))
    assert lora_update(workdir / "models/train/Ernie-Image-T2I_lora/epoch-0.safetensors") > 0


def test_full_script_trains_the_transformer(workdir):
    [(config, argv)] = script_commands(ERNIE_IMAGE, "full/ERNIE-Image.sh")
    assert config == ERNIE_IMAGE / "full/accelerate_config_zero3.yaml"
    assert_deepspeed_config(config, 3)
    result = run_command(ErnieImagePipeline, argv)
    assert result["module"].pipe.model_configs["dit"].model_id == "PaddlePaddle/ERNIE-Image"
    assert all(torch.isfinite(torch.tensor(result["losses"])))
    assert (workdir / "models/train/Ernie-Image-T2I_full/epoch-0.safetensors").is_file()
