"""The reference's Krea 2 commands (DiffSynth-Studio fed7b18, ``examples/krea2/model_training``) run as written on the
tiny repos through the trainer's ``main``.

Each ``accelerate launch`` command runs from a scratch working folder with only what a user on a small machine would
change: the dataset (drawn at the path the script names), sizes, epochs and repeats, and ``DIFFSYNTH_MODEL_BASE_PATH``
pointing at the tiny repos.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from diffsynth.pipelines.krea2.pipeline import Krea2Pipeline
from tests.examples.helpers import lora_update, run_command, script_commands

from .test_scripts import REPO

KREA2 = REPO / "examples" / "krea2" / "model_training"


@pytest.mark.parametrize("release", ["Raw", "Turbo"])
def test_lora_scripts_train_every_named_module(workdir, release):
    [(config, argv)] = script_commands(KREA2, f"lora/Krea-2-{release}.sh")
    assert config is None
    result = run_command(Krea2Pipeline, argv)
    pipe = result["module"].pipe
    assert pipe.model_configs["dit"].model_id == f"krea/Krea-2-{release}" and pipe.is_distilled == (release == "Turbo")
    assert result["global_step"] == 2 and all(torch.isfinite(torch.tensor(result["losses"])))
    # --align_to_opensource_format writes diffusers' names under transformer., as the reference's Krea converter does.
    path = workdir / f"models/train/Krea-2-{release}_lora/epoch-0.safetensors"
    weights = load_file(str(path))
    assert "transformer.transformer_blocks.0.attn.to_q.lora_A.weight" in weights
    assert all(key.startswith("transformer.") for key in weights) and lora_update(path) > 0
    # Every module the reference names: 2 blocks x 8 layers, 2 text-fusion blocks x 8, and the 8 outside them.
    assert len([key for key in weights if "lora_B" in key]) == 2 * 8 + 2 * 8 + 8


@pytest.mark.parametrize("release", ["Raw", "Turbo"])
def test_full_scripts_train_the_transformer(workdir, release):
    [(config, argv)] = script_commands(KREA2, f"full/Krea-2-{release}.sh")
    result = run_command(Krea2Pipeline, argv)
    assert result["module"].pipe.model_configs["dit"].model_id == f"krea/Krea-2-{release}"
    assert all(torch.isfinite(torch.tensor(result["losses"])))
    assert (workdir / f"models/train/Krea-2-{release}_full/epoch-0.safetensors").is_file()
