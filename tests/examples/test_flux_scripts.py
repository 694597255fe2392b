"""The reference's FLUX.1 commands (DiffSynth-Studio fed7b18, ``examples/flux/model_training``) run as written on the
tiny repos through the trainer's ``main``, and the ones for features not supported here stop with one line.

Each ``accelerate launch`` command runs from a scratch working folder with only what a user on a small machine would
change: the dataset (drawn at the path the script names), sizes, epochs and repeats, and ``DIFFSYNTH_MODEL_BASE_PATH``
pointing at the tiny repos. The full fine-tunes' DeepSpeed configs (8 GPUs: ZeRO-2, ZeRO-2 with CPU offload, ZeRO-3)
are checked to be accepted by accelerate's own config reader; their commands train here in-process, as one process.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from diffsynth.pipelines.flux.pipeline import FluxPipeline
from tests.examples.helpers import assert_deepspeed_config, draw_dataset, run_command, script_commands
from tests.pipelines.family_helpers import refused_before_loading

from .test_scripts import REPO

FLUX = REPO / "examples" / "flux" / "model_training"
RELEASES = ("FLUX.1-dev", "FLUX.1-Kontext-dev", "FLUX.1-Krea-dev")


def commands(relative: str) -> list[tuple[Path | None, list[str]]]:
    """``(accelerate config or None, trainer argv)`` of each launch command of a script, sizes made small."""
    return script_commands(FLUX, relative, {"--height": "32", "--width": "48"})


def run_in_process(argv: list[str]) -> dict:
    """A command's run, on a two-sample dataset (a Kontext image per sample for a Kontext command) where it expects one."""
    return run_command(FluxPipeline, argv, lambda argv: draw_dataset(argv, "kontext_images", column="kontext_images"))


def trained(path: Path, lora: bool) -> float:
    """The largest LoRA up-factor entry (a LoRA) or the largest weight (a full checkpoint) of a file."""
    tensors = load_file(str(path))
    return max(value.abs().max().item() for key, value in tensors.items()
               if not lora or "lora_B" in key or "lora_up" in key)


def test_the_reference_scripts_and_configs_exist():
    names = {str(path.relative_to(FLUX)) for path in FLUX.rglob("*") if path.is_file()}
    assert {*(f"{kind}/{name}.sh" for kind in ("lora", "full") for name in RELEASES), "train.py",
            "full/accelerate_config.yaml", "full/accelerate_config_zero2offload.yaml",
            "full/accelerate_config_zero3.yaml"} <= names


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("kind", ["lora", "full"])
def test_script_trains_on_the_tiny_repos(workdir, kind, release):
    [(config, argv)] = commands(f"{kind}/{release}.sh")
    assert config == (FLUX / "full/accelerate_config.yaml" if kind == "full" else None)
    result = run_in_process(argv)
    assert result["global_step"] == 2 and all(torch.isfinite(torch.tensor(result["losses"])))
    output = workdir / argv[argv.index("--output_path") + 1] / "epoch-0.safetensors"
    assert trained(output, lora=kind == "lora") > 0
    pipe = result["module"].pipe
    assert pipe.model_configs["dit"].model_id == "black-forest-labs/" + release
    assert pipe.model_configs["text_encoder_2"].model_id == "black-forest-labs/FLUX.1-dev"
    if kind == "lora":  # --align_to_opensource_format: BFL's fused names, kohya style
        assert all(key.startswith("lora_unet_") for key in load_file(str(output)))


@pytest.mark.parametrize("release", ["FLUX.1-dev", "FLUX.1-Kontext-dev"])
def test_npu_scripts_are_the_full_commands_with_the_offload_config(workdir, release):
    [(config, argv)] = commands(f"special/npu_training/{release}-NPU.sh")
    assert config == FLUX / "full/accelerate_config_zero2offload.yaml"
    assert argv == commands(f"full/{release}.sh")[0][1]
    result = run_in_process(argv)
    assert result["global_step"] == 2 and all(torch.isfinite(torch.tensor(result["losses"])))


@pytest.mark.parametrize(("name", "stage", "offload"), [("accelerate_config.yaml", 2, "none"),
                                                        ("accelerate_config_zero2offload.yaml", 2, "cpu"),
                                                        ("accelerate_config_zero3.yaml", 3, "none")])
def test_the_deepspeed_configs_are_accepted_by_accelerate(name, stage, offload):
    assert_deepspeed_config(FLUX / "full" / name, stage, offload)


DEV = "black-forest-labs/FLUX.1-dev"
ENCODERS = f"{DEV}:text_encoder/model.safetensors,{DEV}:text_encoder_2/*.safetensors,{DEV}:ae.safetensors"
DATA = ["--dataset_base_path", "data/d", "--dataset_metadata_path", "data/d/metadata.csv", "--max_pixels", "1048576"]


def refused(models: str, *flags: str) -> list[str]:
    return [*DATA, "--model_id_with_origin_paths", models, *flags]


# The distinguishing flags of the reference's FLUX scripts for features not supported here (lora/ and full/ share
# them), as they write them, and what the one line of refusal names.
REFUSED = {
    "FLEX.2-preview": (refused(f"ostris/Flex.2-preview:Flex.2-preview.safetensors,{ENCODERS}"), "Flex.2"),
    "FLUX.1-Fill-dev": (refused("black-forest-labs/FLUX.1-Fill-dev:flux1-fill-dev.safetensors,"
                                "black-forest-labs/FLUX.1-Fill-dev:ae.safetensors", "--extra_inputs",
                                "flux_fill_image,flux_fill_mask"), "FLUX.1 Fill"),
    "FLUX.1-Redux-dev": (refused(f"{DEV}:flux1-dev.safetensors,{ENCODERS},black-forest-labs/FLUX.1-Redux-dev:"
                                 "flux1-redux-dev.safetensors", "--extra_inputs", "flux_redux_image"), "Redux"),
    "FLUX.1-dev-AttriCtrl": (refused(f"{DEV}:flux1-dev.safetensors,{ENCODERS},DiffSynth-Studio/AttriCtrl-FLUX.1-Dev:"
                                     "models/brightness.safetensors", "--trainable_models", "value_controller"),
                             "AttriCtrl"),
    "FLUX.1-dev-Controlnet-Inpainting-Beta": (
        refused(f"{DEV}:flux1-dev.safetensors,{ENCODERS},alimama-creative/FLUX.1-dev-Controlnet-Inpainting-Beta:"
                "diffusion_pytorch_model.safetensors", "--trainable_models", "controlnet"), "ControlNets"),
    "FLUX.1-dev-Controlnet-Union-alpha": (
        refused(f"{DEV}:flux1-dev.safetensors,{ENCODERS},InstantX/FLUX.1-dev-Controlnet-Union-alpha:"
                "diffusion_pytorch_model.safetensors", "--trainable_models", "controlnet"), "ControlNets"),
    "FLUX.1-dev-Controlnet-Upscaler": (
        refused(f"{DEV}:flux1-dev.safetensors,{ENCODERS},jasperai/Flux.1-dev-Controlnet-Upscaler:"
                "diffusion_pytorch_model.safetensors", "--trainable_models", "controlnet"), "ControlNets"),
    "FLUX.1-dev-EliGen": (refused(f"{DEV}:flux1-dev.safetensors,{ENCODERS}", "--extra_inputs",
                                  "eligen_entity_masks,eligen_entity_prompts", "--lora_base_model", "dit"), "EliGen"),
    "FLUX.1-dev-IP-Adapter": (refused(f"{DEV}:flux1-dev.safetensors,{ENCODERS},InstantX/FLUX.1-dev-IP-Adapter:"
                                      "ip-adapter.bin,google/siglip-so400m-patch14-384:model.safetensors"),
                              "IP-Adapter"),
    "FLUX.1-dev-InfiniteYou": (refused(f"{DEV}:flux1-dev.safetensors,{ENCODERS},ByteDance/InfiniteYou:infu_flux_v1.0/"
                                       "aes_stage2/image_proj_model.bin"), "InfiniteYou"),
    "FLUX.1-dev-LoRA-Encoder": (refused(f"{DEV}:flux1-dev.safetensors,{ENCODERS},DiffSynth-Studio/"
                                        "LoRA-Encoder-FLUX.1-Dev:model.safetensors"), "LoRA-Encoder"),
    "Insert-Anything": (refused("black-forest-labs/FLUX.1-Fill-dev:flux1-fill-dev.safetensors,"
                                "black-forest-labs/FLUX.1-Redux-dev:flux1-redux-dev.safetensors"), "Insert-Anything"),
    "Nexus-Gen": (refused(f"DiffSynth-Studio/Nexus-GenV2:model*.safetensors,{ENCODERS}"), "Nexus-Gen"),
    "Step1X-Edit": (refused("Qwen/Qwen2.5-VL-7B-Instruct:,stepfun-ai/Step1X-Edit:step1x-edit-i1258.safetensors"),
                    "Step1X-Edit"),
}


@pytest.mark.parametrize("script", list(REFUSED))
def test_unsupported_scripts_stop_with_one_line_before_loading(workdir, script, capsys):
    argv, reason = REFUSED[script]
    assert reason in refused_before_loading(FluxPipeline, ["--lora_base_model", "dit", *argv], workdir, capsys)
