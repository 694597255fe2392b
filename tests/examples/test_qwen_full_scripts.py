"""The reference's Qwen-Image full fine-tunes (DiffSynth-Studio fed7b18, ``examples/qwen_image/model_training/full``)
run as written on the tiny repos through the trainer's ``main``, as do the LoRA scripts of the releases that only have
a tiny repo here under an alias (FireRed-Image-Edit, Qwen-Image-Distill-Full); the Blockwise ControlNets' scripts are
run in ``test_qwen_blockwise_scripts.py``.

Each ``accelerate launch`` command runs from a scratch working folder with only what a user on a small machine would
change: the dataset (drawn at the path the script names), sizes, epochs and repeats, and ``DIFFSYNTH_MODEL_BASE_PATH``
pointing at the tiny repos (plus the releases without a tiny repo of their own, under their ids: see ``model_root``).
The DeepSpeed configs the scripts name (8 GPUs: ZeRO-2, ZeRO-2 with the optimizer on the CPU, ZeRO-3) are checked
with accelerate's own config reader; their commands train here in-process, as one process.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from diffsynth.core.data.example_dataset import build_example_dataset
from diffsynth.core.data.example_edit_dataset import build_example_edit_dataset
from diffsynth.core.data.example_layered_dataset import build_example_layered_dataset
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.testing.tiny_models import QWEN_IMAGE_EDIT_2509_MODEL_ID, QWEN_IMAGE_MODEL_ID
from diffsynth.testing.tiny_qwen_layered import (
    QWEN_IMAGE_LAYERED_CONTROL_MODEL_ID,
    QWEN_IMAGE_LAYERED_MODEL_ID,
    build_tiny_qwen_image_layered,
    build_tiny_qwen_image_layered_control,
)
from diffsynth.training.config.parsers import build_parser
from tests.examples.helpers import (
    assert_deepspeed_config,
    config_file,
    linked_model_root,
    lora_update,
    run_command,
    script_commands,
)

from .test_scripts import REPO, launch_commands

QWEN = REPO / "examples" / "qwen_image" / "model_training"
FULL = QWEN / "full"
# Script -> the transformer repo it trains (the Distill-Full release keeps its shards at the repo's root).
RELEASES = {
    "Qwen-Image": "Qwen/Qwen-Image",
    "Qwen-Image-2512": "Qwen/Qwen-Image-2512",
    "Qwen-Image-Edit": "Qwen/Qwen-Image-Edit",
    "Qwen-Image-Edit-2509": "Qwen/Qwen-Image-Edit-2509",
    "Qwen-Image-Edit-2511": "Qwen/Qwen-Image-Edit-2511",
    "Qwen-Image-Distill-Full": "DiffSynth-Studio/Qwen-Image-Distill-Full",
    "FireRed-Image-Edit-1.0": "FireRedTeam/FireRed-Image-Edit-1.0",
    "FireRed-Image-Edit-1.1": "FireRedTeam/FireRed-Image-Edit-1.1",
    "Qwen-Image-Layered": QWEN_IMAGE_LAYERED_MODEL_ID,
    "Qwen-Image-Layered-Control": QWEN_IMAGE_LAYERED_CONTROL_MODEL_ID,
}
CONFIGS = {"accelerate_config.yaml": (2, "none"), "accelerate_config_zero2offload.yaml": (2, "cpu"),
           "accelerate_config_zero3.yaml": (3, "none")}


def checkpoint_weights(path: Path, model: str = "dit") -> dict[str, torch.Tensor]:
    """The weights of the full checkpoint ``path`` (``<output_path>/epoch-<e>``), in whichever layout the trainer
    wrote: the file ``<path>.safetensors``, or a diffusers folder (``config.json`` beside ``*.safetensors`` shards)
    named ``<path>.<model>/`` or ``<path>/``."""
    single = path.with_name(path.name + ".safetensors")
    if single.is_file():
        return load_file(str(single))
    folder = next((candidate for candidate in (path.with_name(f"{path.name}.{model}"), path)
                   if (candidate / "config.json").is_file()), None)
    assert folder is not None, f"neither {single} nor a diffusers folder {path}.{model}/ or {path}/ was written"
    shards = sorted(folder.glob("*.safetensors"))
    assert shards, f"{folder}/ holds no .safetensors shard"
    return {key: value for shard in shards for key, value in load_file(str(shard)).items()}


def changed_weights(saved: dict[str, torch.Tensor], initial: dict[str, torch.Tensor]) -> list[str]:
    """The names of the saved weights that differ from the released ones; a full checkpoint holds every one."""
    assert set(saved) == set(initial), (sorted(set(saved) - set(initial))[:5], sorted(set(initial) - set(saved))[:5])
    return [key for key, value in saved.items() if not torch.equal(value.float(), initial[key].float())]


def transformer_weights(repo: Path) -> dict[str, torch.Tensor]:
    """The released transformer's weights: the shards under ``transformer/``, or at the root (Distill-Full)."""
    folder = repo / "transformer" if (repo / "transformer").is_dir() else repo
    return {key: value for shard in sorted(folder.glob("diffusion_pytorch_model*.safetensors"))
            for key, value in load_file(str(shard)).items()}


def commands(relative: str) -> list[tuple[Path | None, list[str]]]:
    """``(accelerate config or None, trainer argv)`` of each launch command of a script, sizes made small."""
    return script_commands(QWEN, relative)


def draw_dataset(argv: list[str]) -> None:
    """Draws a two-sample dataset where a command expects one: one edit image per sample in a CSV (Edit), a list in
    JSON (2509+) for an Edit command, RGBA layers for a Layered one (one layer to extract for Layered-Control)."""
    args = build_parser().parse_args(argv)
    if not Path(args.dataset_metadata_path).is_file():
        if args.extra_inputs == "layer_num,layer_input_image":
            build_example_layered_dataset(args.dataset_base_path,
                                          control="layer" if "Layered-Control" in args.dataset_base_path else None)
        elif args.extra_inputs == "edit_image":
            build_example_edit_dataset(args.dataset_base_path, num_samples=2,
                                       num_edit_images=1 if args.dataset_metadata_path.endswith(".csv") else 2)
        else:
            build_example_dataset(args.dataset_base_path, num_images=2)


def run_in_process(argv: list[str]) -> dict:
    return run_command(QwenImagePipeline, argv, draw_dataset)


@pytest.fixture(scope="module")
def model_root(tiny_root, tmp_path_factory) -> Path:
    """The tiny repos, plus the releases that share a tiny repo's layout under their own ids:
    ``Qwen/Qwen-Image-2512`` (the whole Qwen-Image repo), the FireRed-Image-Edit releases (the whole Edit-2509 repo,
    processor included: diffusers loads them with ``QwenImageEditPlusPipeline``) and
    ``DiffSynth-Studio/Qwen-Image-Distill-Full`` (the Qwen-Image transformer folder, as that release keeps the
    transformer at the root); and the tiny Qwen-Image-Layered and Layered-Control repos."""
    firered = {f"FireRedTeam/FireRed-Image-Edit-{version}": QWEN_IMAGE_EDIT_2509_MODEL_ID for version in ("1.0", "1.1")}
    root = linked_model_root(tiny_root, tmp_path_factory.mktemp("full_model_root"),
                             {"Qwen/Qwen-Image-2512": QWEN_IMAGE_MODEL_ID, **firered})
    qwen = tiny_root / QWEN_IMAGE_MODEL_ID
    (root / "DiffSynth-Studio").mkdir(exist_ok=True)
    (root / "DiffSynth-Studio" / "Qwen-Image-Distill-Full").symlink_to(qwen / "transformer", target_is_directory=True)
    build_tiny_qwen_image_layered(root)
    build_tiny_qwen_image_layered_control(root)
    return root


@pytest.fixture
def workdir(workdir, monkeypatch) -> Path:
    """The examples' scratch working folder, with Edit's images made small."""
    # 64 x 64 edit images instead of the release's 1024 x 1024, which would cost the tiny VAE seconds per sample
    monkeypatch.setattr(QwenImagePipeline, "edit_image_pixels", 64 * 64)
    monkeypatch.setattr(QwenImagePipeline, "edit_condition_pixels", 64 * 64)
    return workdir


def test_the_reference_scripts_and_configs_exist():
    names = {path.name for path in FULL.iterdir()}
    assert {*(f"{name}.sh" for name in RELEASES), *CONFIGS} <= names


@pytest.mark.parametrize("release", list(RELEASES))
def test_script_trains_every_weight_of_the_transformer(workdir, model_root, release):
    [(config, argv)] = commands(f"full/{release}.sh")
    assert config == FULL / "accelerate_config_zero2offload.yaml"
    result = run_in_process(argv)
    assert result["global_step"] == 2 and all(torch.isfinite(torch.tensor(result["losses"])))
    pipe = result["module"].pipe
    assert pipe.model_configs["dit"].model_id == RELEASES[release]
    assert (pipe.processor is not None) is ("Edit" in release) and pipe.dit.zero_cond_t is ("2511" in release)
    saved = checkpoint_weights(workdir / argv[argv.index("--output_path") + 1] / "epoch-0")
    released = transformer_weights(model_root / RELEASES[release])
    unchanged = set(saved) - set(changed_weights(saved, released))
    # Every weight moved but the RMSNorm scales: stored in bf16 at 1.0, where a 1e-5 step is below the resolution.
    assert len(unchanged) < len(saved) / 4 and all(torch.all(released[key] == 1) for key in unchanged), unchanged


@pytest.mark.parametrize("release", ["FireRed-Image-Edit-1.0", "FireRed-Image-Edit-1.1", "Qwen-Image-Distill-Full",
                                     "Qwen-Image-Layered"])
def test_lora_script_of_an_aliased_release_trains_its_transformer(workdir, model_root, release):
    [(config, argv)] = commands(f"lora/{release}.sh")
    result = run_in_process(argv)
    assert config is None and result["global_step"] == 2
    pipe = result["module"].pipe
    assert pipe.model_configs["dit"].model_id == RELEASES[release]
    assert (pipe.processor is not None) is ("Edit" in release)
    assert lora_update(workdir / argv[argv.index("--output_path") + 1] / "epoch-0.safetensors") > 0


@pytest.mark.parametrize(("name", "stage_and_offload"), list(CONFIGS.items()))
def test_the_deepspeed_configs_are_accepted_by_accelerate(name, stage_and_offload):
    assert_deepspeed_config(FULL / name, *stage_and_offload)


FAMILY_FOLDERS = {"Qwen-Image": "qwen_image", "Wan": "wanvideo", "Z-Image": "z_image", "FLUX.1": "flux",
                  "FLUX.2 [klein]": "flux2"}


def recipe_rows(language: str) -> list[tuple[str, list[str], str | None]]:
    """``(family, scripts, accelerate config or None)`` of each row of a Full fine-tuning page's recipe table."""
    text = (REPO / "docs" / language / "Full_Fine_Tuning.md").read_text()
    section = text.split("\n## ", 2)[1]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 4 and cells[0] in FAMILY_FOLDERS:
            config = re.search(r"`(full/[^`]+\.yaml)`", cells[2])
            rows.append((cells[0], re.findall(r"`(full/[^`]+\.sh)`", cells[1]), config and config.group(1)))
    return rows


def test_the_recipes_table_names_each_scripts_accelerate_config():
    rows = recipe_rows("en")
    assert rows == recipe_rows("zh") and {family for family, _, _ in rows} == set(FAMILY_FOLDERS)
    listed = set()
    for family, scripts, config in rows:
        training = REPO / "examples" / FAMILY_FOLDERS[family] / "model_training"
        for script in scripts:
            listed.add(training / script)
            # A two-stage script's config is its training stage's (stage 1 only caches, in one process).
            configs = {config_file(words) for words in launch_commands((training / script).read_text())
                       if "sft:data_process" not in words}
            assert configs == {config and training / config}, (script, configs)
    assert set(FULL.glob("*.sh")) | set((REPO / "examples/wanvideo/model_training/full").glob("*.sh")) <= listed
