"""The reference's Qwen-Image Blockwise ControlNet scripts (``lora/`` and ``full/Qwen-Image-Blockwise-ControlNet-*.sh``,
``scripts/Qwen-Image-Blockwise-ControlNet-*Initialize.py``) run as written on the tiny repos, through the trainer's
``main``: sizes, epochs and repeats made small, the dataset drawn where the command names it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from diffsynth.core.data.example_edit_dataset import build_example_edit_dataset
from diffsynth.pipelines.qwen_image.original import identify
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID
from diffsynth.testing.tiny_qwen_blockwise import QWEN_BLOCKWISE_MODEL_ID
from diffsynth.training.config.parsers import build_parser
from tests.conftest import load_lora_into_diffusers
from tests.examples.helpers import load_script, lora_update, run_command, script_commands

from .test_scripts import REPO

QWEN = REPO / "examples" / "qwen_image" / "model_training"
MASK = "blockwise_controlnet_inpaint_mask"


def draw_dataset(argv: list[str]) -> None:
    """Two samples with a control image, and a mask where the command reads one."""
    args = build_parser().parse_args(argv)
    if not Path(args.dataset_metadata_path).is_file():
        build_example_edit_dataset(args.dataset_base_path, num_samples=2, column="blockwise_controlnet_image",
                                   mask_column=MASK if MASK in args.extra_inputs else None)


def run(argv: list[str]) -> dict:
    return run_command(QwenImagePipeline, argv, draw_dataset)


def output(workdir: Path, argv: list[str]) -> Path:
    return workdir / argv[argv.index("--output_path") + 1] / "epoch-0.safetensors"


@pytest.mark.parametrize("kind", ["Canny", "Depth", "Inpaint"])
def test_full_script_trains_the_controlnet_under_the_release_names(workdir, tiny_root, kind):
    [(config, argv)] = script_commands(QWEN, f"full/Qwen-Image-Blockwise-ControlNet-{kind}.sh")
    assert (config is not None) is (kind == "Inpaint")
    result = run(argv)
    assert result["global_step"] == 2 and all(torch.isfinite(torch.tensor(result["losses"])))
    released = load_file(str(tiny_root / QWEN_BLOCKWISE_MODEL_ID.format(kind=kind) / "model.safetensors"))
    saved = load_file(str(output(workdir, argv)))
    assert set(saved) == set(released)
    moved = [key for key in saved if not torch.equal(saved[key], released[key])]
    assert len(moved) > len(saved) / 2, sorted(set(saved) - set(moved))
    # The checkpoint reads as the release does (in place of model.safetensors).
    assert identify([output(workdir, argv)]).config == identify(
        [tiny_root / QWEN_BLOCKWISE_MODEL_ID.format(kind=kind) / "model.safetensors"]).config


@pytest.mark.parametrize("kind", ["Canny", "Depth", "Inpaint"])
def test_lora_script_trains_a_plain_qwen_image_lora_beside_the_controlnet(workdir, tiny_root, kind):
    from diffusers import QwenImagePipeline as DiffusersQwenImagePipeline

    [(_, argv)] = script_commands(QWEN, f"lora/Qwen-Image-Blockwise-ControlNet-{kind}.sh")
    result = run(argv)
    assert result["global_step"] == 2 and result["module"].pipe.blockwise_controlnet is not None
    path = output(workdir, argv)
    assert lora_update(path) > 0
    pipe = DiffusersQwenImagePipeline.from_pretrained(str(tiny_root / QWEN_IMAGE_MODEL_ID), dtype=torch.float32)
    assert load_lora_into_diffusers(pipe, path, "blockwise") == []


def test_initialize_script_starts_a_controlnet_the_from_scratch_command_trains(workdir):
    script = load_script("examples/qwen_image/model_training/scripts/"
                         "Qwen-Image-Blockwise-ControlNet-Inpaint-Initialize.py", "blockwise_initialize")
    script.main(num_layers=2, dim=32)  # the tiny transformer's sizes, at the script's path
    text = (QWEN / "full/Qwen-Image-Blockwise-ControlNet-Inpaint.sh").read_text()
    scratch = re.sub(r"^# ?", "", text.split("pre-train", 1)[1], flags=re.MULTILINE)
    [(_, argv)] = script_commands(QWEN, "full/Qwen-Image-Blockwise-ControlNet-Inpaint.sh", text=scratch)
    initial = load_file("models/blockwise_controlnet_inpaint.safetensors")
    assert all(not value.any() for key, value in initial.items() if "output_proj" in key or "img_in" in key)
    assert run(argv)["global_step"] == 2
    saved = load_file(str(output(workdir, argv)))
    assert set(saved) == set(initial) and any(saved[key].any() for key in saved if "output_proj" in key)
