"""The reference's FLUX.2 [klein] and [dev] commands run as written on the tiny repos, through the trainer's ``main``.

Each ``accelerate launch`` command of a script, the commented Edit ones included, runs from a scratch working folder
with only what a user on a small machine would change: the dataset (drawn at the path the script names), the sizes,
the epochs and the repeat count, and ``DIFFSYNTH_MODEL_BASE_PATH`` on the tiny repos. Commands launched with the
DeepSpeed ``accelerate_config.yaml`` run their trainer arguments in this process (one CPU process; the config itself is
checked to be the reference's).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from diffsynth.pipelines.flux2_klein.pipeline import Flux2KleinPipeline
from tests.examples.helpers import draw_dataset, run_command, script_commands
from tests.pipelines.family_helpers import refused_before_loading

from .test_scripts import REPO

FLUX2 = REPO / "examples" / "flux2" / "model_training"
RELEASES = ("FLUX.2-klein-4B", "FLUX.2-klein-9B", "FLUX.2-klein-base-4B", "FLUX.2-klein-base-9B")
SCRIPTS = [f"{kind}/{name}.sh" for kind in ("lora", "full") for name in RELEASES]


def commands(relative: str, edit: bool) -> list[list[str]]:
    """The trainer argv of each launch command of a script (the commented Edit ones with ``edit``), made small."""
    text = (FLUX2 / relative).read_text()
    plain, _, edit_section = text.partition("\n# Edit\n")
    if edit:
        plain = re.sub(r"^# ?", "", edit_section, flags=re.MULTILINE)
    return [argv for _, argv in script_commands(FLUX2, relative, text=plain)]


def run_in_process(argv: list[str]) -> dict:
    """A command's run, on a two-sample dataset (two reference images per sample for an Edit command) where it expects one."""
    return run_command(Flux2KleinPipeline, argv, lambda argv: draw_dataset(argv, "edit_image", num_edit_images=2))


def trained(path: Path, lora: bool) -> float:
    """The largest LoRA-B entry (a LoRA) or the largest weight (a full checkpoint) of a file: 0 means nothing."""
    tensors = load_file(str(path))
    return max(value.abs().max().item() for key, value in tensors.items() if not lora or "lora_B" in key)


def test_the_reference_scripts_and_configs_exist():
    names = {str(path.relative_to(FLUX2)) for path in FLUX2.rglob("*") if path.is_file()}
    assert {*SCRIPTS, *DEV_SCRIPTS, "special/split_training/FLUX.2-klein-base-4B_lora.sh",
            "full/accelerate_config.yaml", "full/accelerate_config_zero3.yaml", "train.py"} <= names


@pytest.mark.parametrize("edit", [False, True], ids=["plain", "edit"])
@pytest.mark.parametrize("script", SCRIPTS)
def test_script_trains_on_the_tiny_repos(workdir, script, edit):
    [argv] = commands(script, edit)
    if edit:  # 64 x 64 reference images (the smallest FLUX.2 takes) instead of the dataset's
        argv = [*argv, "--height", "64", "--width", "64"]
    result = run_in_process(argv)
    assert result["global_step"] == 2 and all(torch.isfinite(torch.tensor(result["losses"])))
    output = workdir / argv[argv.index("--output_path") + 1] / "epoch-0.safetensors"
    assert trained(output, lora=script.startswith("lora")) > 0
    pipe = result["module"].pipe
    assert pipe.model_configs["dit"].model_id == "black-forest-labs/" + Path(script).stem


def test_split_script_trains_on_the_cache(workdir):
    stage_one, stage_two = commands("special/split_training/FLUX.2-klein-base-4B_lora.sh", edit=False)
    assert run_in_process(stage_one)["cached"] == 2
    result = run_in_process(stage_two)
    assert result["global_step"] == 2
    assert trained(workdir / "models/train/FLUX.2-klein-base-4B_lora/epoch-0.safetensors", lora=True) > 0


DEV_SCRIPTS = ("lora/FLUX.2-dev.sh", "special/npu_training/FLUX.2-dev-Lora-NPU.sh")


def test_the_dev_script_trains_in_two_stages(workdir):
    """Stage 1 caches with the Mistral-3 encoder (the script names no tokenizer: FLUX.2-dev's tokenizer/ is found beside
    it), stage 2 trains the guidance-distilled transformer, whose 48 single blocks the targets name one by one, from the
    cache. The NPU script is the same two commands, its stage 2 under ZeRO-3 with the model built on the CPU."""
    # No data loader workers: spawning the scripts' 8 per run would cost more than the tiny runs themselves.
    (stage_one, stage_two), (npu_one, npu_two) = (script_commands(FLUX2, script, {"--dataset_num_workers": "0"})
                                                  for script in DEV_SCRIPTS)
    assert stage_one == npu_one and stage_one[0] is None and stage_two[0] is None
    assert npu_two == (FLUX2 / "full/accelerate_config_zero3.yaml", [*stage_two[1][:-2], "--initialize_model_on_cpu",
                                                                       *stage_two[1][-2:]])
    assert run_in_process(stage_one[1])["cached"] == 2
    result = run_in_process(stage_two[1])
    assert result["global_step"] == 2 and result["module"].pipe.dit.config.guidance_embeds
    assert trained(workdir / "models/train/FLUX.2-dev-LoRA-splited/epoch-0.safetensors", lora=True) > 0


KLEIN = ("black-forest-labs/FLUX.2-klein-4B:text_encoder/*.safetensors,black-forest-labs/FLUX.2-klein-base-4B:"
         "transformer/*.safetensors,black-forest-labs/FLUX.2-klein-4B:vae/diffusion_pytorch_model.safetensors")
DATA = ["--dataset_base_path", "data/d", "--dataset_metadata_path", "data/d/metadata.csv", "--max_pixels", "1048576"]
# The distinguishing flags of the reference's scripts for features not supported here, as they write them.
REFUSED = {
    "full/Template-KleinBase4B-Brightness": (
        [*DATA, "--model_id_with_origin_paths", KLEIN, "--template_model_id_or_path",
         "DiffSynth-Studio/Template-KleinBase4B-Brightness:", "--trainable_models", "template_model"],
        "template models (Template-KleinBase4B-*)"),
    "full/KleinBase4B-i2L-v2": (
        [*DATA, "--model_id_with_origin_paths", KLEIN, "--template_model_id_or_path",
         "DiffSynth-Studio/KleinBase4B-i2L-v2:", "--trainable_models", "template_model"], "image-to-LoRA (i2L)"),
}


@pytest.mark.parametrize("script", list(REFUSED))
def test_unsupported_scripts_stop_with_one_line_before_loading(workdir, script, capsys):
    argv, reason = REFUSED[script]
    assert reason in refused_before_loading(Flux2KleinPipeline, argv, workdir, capsys)
