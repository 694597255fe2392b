"""The reference's Stable Diffusion 1.5 and SDXL commands (DiffSynth-Studio fed7b18, ``examples/stable_diffusion`` and
``examples/stable_diffusion_xl``) run as written on the tiny repos through the trainer's ``main``, sizes aside."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from diffsynth.pipelines.stable_diffusion.pipeline import StableDiffusionPipeline
from diffsynth.pipelines.stable_diffusion.xl import SDXL_MODEL_ID, StableDiffusionXLPipeline
from tests.examples.helpers import run_command, script_commands

from .test_scripts import REPO

SD = REPO / "examples" / "stable_diffusion" / "model_training"
SDXL = REPO / "examples" / "stable_diffusion_xl" / "model_training"


@pytest.mark.slow
def test_the_lora_script_trains_every_linear_layer_of_the_unet(workdir):
    [(config, argv)] = script_commands(SD, "lora/stable-diffusion-v1-5.sh")
    assert config is None and argv[argv.index("--lora_target_modules") + 1] == ""
    result = run_command(StableDiffusionPipeline, argv)
    assert result["global_step"] == 2 and all(torch.isfinite(torch.tensor(result["losses"])))
    weights = load_file(str(workdir / "models/train/stable-diffusion-v1-5_lora/epoch-0.safetensors"))
    unet = result["module"].pipe.unet
    # The UNet's own Linear layers: peft's wrappers hold them as base_layer, beside the LoRA factors.
    linear = {name.removesuffix(".base_layer") for name, module in unet.named_modules()
              if isinstance(module, torch.nn.Linear) and ".lora_" not in name}
    # kohya's names: every Linear layer of the UNet, and nothing else (its 1x1 convolutions stay untouched).
    stems = {key.split(".")[0] for key in weights}
    assert stems == {"lora_unet_" + name.replace(".", "_") for name in linear}
    assert max(value.abs().max().item() for key, value in weights.items() if "lora_up" in key) > 0


@pytest.mark.slow
@pytest.mark.parametrize(("folder", "script", "pipeline"), [
    (SD, "full/stable-diffusion-v1-5.sh", StableDiffusionPipeline),
    (SDXL, "full/stable-diffusion-xl-base-1.0.sh", StableDiffusionXLPipeline),
], ids=["sd15", "sdxl"])
def test_the_full_scripts_train_the_unet(workdir, folder, script, pipeline):
    [(config, argv)] = script_commands(folder, script)
    result = run_command(pipeline, argv)
    assert all(torch.isfinite(torch.tensor(result["losses"])))
    output = argv[argv.index("--output_path") + 1]
    saved = load_file(str(workdir / output / "epoch-0.safetensors"))
    unet = result["module"].pipe.unet.state_dict()
    assert set(saved) == set(unet) and max((saved[key] - unet[key]).abs().max().item() for key in unet) == 0


@pytest.mark.slow
def test_the_sdxl_lora_script_trains_its_layers_and_loads_in_diffusers(workdir, tiny_root):
    import diffusers

    from tests.conftest import load_lora_into_diffusers
    from tests.pipelines.family_helpers import load_theirs, render_theirs

    [(config, argv)] = script_commands(SDXL, "lora/stable-diffusion-xl-base-1.0.sh")
    targets = argv[argv.index("--lora_target_modules") + 1].split(",")
    result = run_command(StableDiffusionXLPipeline, argv)
    assert result["global_step"] == 2 and all(torch.isfinite(torch.tensor(result["losses"])))
    path = workdir / "models/train/stable-diffusion-xl-base-1.0_lora/epoch-0.safetensors"
    # --align_to_opensource_format: kohya's layout, one layer per name of the reference's list.
    assert {key.split(".")[0] for key in load_file(str(path))} == {"lora_unet_" + name.replace(".", "_")
                                                                   for name in targets}
    theirs = load_theirs(tiny_root, diffusers.StableDiffusionXLPipeline, SDXL_MODEL_ID)
    call = {"guidance_scale": 5.0, "negative_prompt": "blurry", "height": 32, "width": 32}
    before = render_theirs(theirs, **call)
    warnings = load_lora_into_diffusers(theirs, path, "sdxl")
    # Only the text encoders' "no LoRA keys" notes: the file trains the UNet alone.
    assert [warning for warning in warnings if not warning.startswith("No LoRA keys associated to")] == []
    assert len([name for name, _ in theirs.unet.named_parameters() if "lora_A" in name]) == len(targets)
    assert (render_theirs(theirs, **call) - before).abs().max() > 1e-5
