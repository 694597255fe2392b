"""The reference's Qwen-Image commands run as written on the tiny repos, through the trainer's ``main``.

Each ``accelerate launch`` command of a script runs from a scratch working folder, with only what a user on a small
machine would change: the dataset (drawn at the path the script names), the sizes, the epochs and the dataset's
repeat count, and ``DIFFSYNTH_MODEL_BASE_PATH`` pointing at the tiny repos (plus ``Qwen/Qwen-Image-2512``, a copy of
the tiny Qwen-Image transformer repo under the 2512 release's id). A command launched with a DeepSpeed config runs
under ``accelerate launch`` with that config, adapted to the CPU (see ``write_configs``): one process, the most
accelerate runs DeepSpeed with on a machine without GPUs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from diffsynth.core.data.example_dataset import build_example_dataset
from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from tests.core.test_quant import needs_bitsandbytes
from tests.examples.helpers import linked_model_root, lora_update, run_command, script_commands, small

from .test_scripts import REPO

QWEN = REPO / "examples" / "qwen_image" / "model_training"


def commands(relative: str) -> list[tuple[Path | None, list[str]]]:
    """``(accelerate config or None, trainer argv)`` of each launch command of a script, sizes made small."""
    return script_commands(QWEN, relative)


def run_in_process(argv: list[str]) -> dict:
    return run_command(QwenImagePipeline, argv)


@pytest.fixture(scope="module")
def model_root(tiny_root, tmp_path_factory) -> Path:
    """The tiny repos, plus ``Qwen/Qwen-Image-2512`` (the tiny Qwen-Image repo under the 2512 id)."""
    return linked_model_root(tiny_root, tmp_path_factory.mktemp("model_root"),
                             {"Qwen/Qwen-Image-2512": QWEN_IMAGE_MODEL_ID})


def test_low_vram_script_trains_under_its_deepspeed_config(workdir, model_root):
    pytest.importorskip("deepspeed")
    from tests.training.test_trainer_deepspeed import launch, write_configs

    (_, stage_one), (config, stage_two) = commands("special/low_vram_training/Qwen-Image-LoRA.sh")
    assert config == QWEN / "special/low_vram_training/deepspeed_zero3_cpuoffload.yaml"
    assert run_in_process(stage_one)["cached"] == 2
    done = launch(write_configs(workdir, accelerate_yaml=config), stage_two, model_root, cwd=workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "released models this stage never runs" not in done.stderr  # stage 2 loads only the transformer
    assert lora_update(workdir / "models/train/Qwen-Image_lora/epoch-0.safetensors") > 0


def test_fp8_script_stores_every_model_in_fp8(workdir):
    from diffsynth.core.fp8 import Fp8Linear
    from diffsynth.core.fp8_conv import is_fp8_conv

    [(_, argv)] = commands("special/fp8_training/Qwen-Image-LoRA.sh")
    result = run_in_process(argv)
    pipe = result["module"].pipe
    assert all(is_fp8_conv(m) for m in pipe.vae.modules() if isinstance(m, torch.nn.Conv3d))
    assert all(isinstance(m.base_layer, Fp8Linear) for m in pipe.dit.modules() if hasattr(m, "lora_A"))
    assert any(isinstance(m, Fp8Linear) for m in pipe.text_encoder.modules())
    assert result["global_step"] == 2
    assert lora_update(workdir / "models/train/Qwen-Image_lora_fp8/epoch-0.safetensors") > 0


def test_differential_script_merges_the_first_lora_into_the_second_runs_base(workdir, caplog):
    first, second = commands("special/differential_training/Qwen-Image-LoRA.sh")
    # Five epochs as written: the second command merges the first's epoch-4 file (ten tiny steps each).
    run_in_process(small(first[1], {"--num_epochs": "5"}))
    with caplog.at_level("INFO", logger="diffsynth.training.objective.training_module"):
        result = run_in_process(small(second[1], {"--num_epochs": "5"}))
    preset = "./models/train/Qwen-Image-LoRA-deterministic/epoch-4.safetensors"
    assert f"--preset_lora_path {preset}: merged into 24 layers of dit" in caplog.text  # 12 targets x 2 blocks
    assert result["global_step"] == 10
    assert lora_update(workdir / "models/train/Qwen-Image-LoRA-differencial/epoch-4.safetensors") > 0


def write_distill_dataset(folder: Path, settings: list[tuple[int, str, int, float]]) -> Path:
    """An example dataset whose rows also say how the distilled sampler draws each image."""
    import csv

    metadata = build_example_dataset(folder, num_images=len(settings))
    with metadata.open(newline="") as file:
        rows = list(csv.DictReader(file))
    with metadata.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["image", "prompt", "seed", "rand_device", "num_inference_steps", "cfg_scale"])
        writer.writerows([row["image"], row["prompt"], *values] for row, values in zip(rows, settings))
    return metadata


def test_distill_script_trains_from_a_csv_of_sampler_settings(workdir):
    [(_, argv)] = commands("lora/Qwen-Image-Distill-LoRA.sh")
    write_distill_dataset(workdir / "data/example_distill_dataset", [(0, "cpu", 2, 1.0), (7, "cpu", 3, 2.5)])
    result = run_in_process(argv)
    assert result["global_step"] == 2 and all(torch.isfinite(torch.tensor(result["losses"])))
    assert lora_update(workdir / "models/train/Qwen-Image-Distill-LoRA_lora/epoch-0.safetensors") > 0


def test_2512_script_trains_on_the_2512_transformer(workdir):
    [(_, argv)] = commands("lora/Qwen-Image-2512.sh")
    result = run_in_process(argv)
    assert result["module"].pipe.model_configs["dit"].model_id == "Qwen/Qwen-Image-2512"
    assert lora_update(workdir / "models/train/Qwen-Image-2512_lora/epoch-0.safetensors") > 0


@needs_bitsandbytes
def test_nf4_script_trains_a_lora_on_a_4_bit_transformer(workdir):
    import bitsandbytes as bnb

    [(_, argv)] = commands("special/quant_training/Qwen-Image-2512-bitsandbytes_nf4.sh")
    result = run_in_process(argv)
    dit = result["module"].pipe.dit
    assert isinstance(dit.transformer_blocks[0].attn.to_q.base_layer, bnb.nn.Linear4bit)
    assert type(dit.transformer_blocks[0].img_mod[1].base_layer) is torch.nn.Linear  # excluded, under its LoRA
    assert lora_update(workdir / "models/train/Qwen-Image-2512_quant_lora/epoch-0.safetensors") > 0


@pytest.mark.parametrize("script", ["lora/Qwen-Image.sh", "special/split_training/Qwen-Image-LoRA.sh"])
def test_plain_and_split_scripts_train(workdir, script):
    results = [run_in_process(argv) for _, argv in commands(script)]
    assert results[-1]["global_step"] == 2 and all(torch.isfinite(torch.tensor(results[-1]["losses"])))
