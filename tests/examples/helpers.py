"""Pieces the example-script tests share: loading a script by path, reading its launch commands made small, and
running the trainer in-process."""

from __future__ import annotations

import importlib.util
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

from safetensors.torch import load_file

from diffsynth.core.data.example_dataset import build_example_dataset
from diffsynth.core.data.example_edit_dataset import build_example_edit_dataset
from diffsynth.training import entry as trainer
from diffsynth.training.config.parsers import build_parser
from tests.conftest import reset_accelerate_state

REPO = Path(__file__).resolve().parents[2]


def load_script(relative_path: str, module_name: str) -> ModuleType:
    """Imports the script at ``relative_path`` (from the repository root) as a module, without running its main."""
    spec = importlib.util.spec_from_file_location(module_name, REPO / relative_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train_lora(pipeline_class: type, metadata: Path, models: str, output: Path, target_modules: str,
               extra: Sequence[str] = (), video: bool = False) -> Path:
    """Trains a rank-4 LoRA of ``dit`` for one seeded epoch in this process and returns its ``epoch-0`` file.

    The learning rate is high enough that merging the result visibly changes a render. No accelerate state is left
    behind: the next in-process run builds its own Accelerator, as a separate launch would.
    """
    argv = [
        "--dataset_base_path", str(metadata.parent), "--dataset_metadata_path", str(metadata),
        "--max_pixels", "4096", "--model_id_with_origin_paths", models, "--lora_base_model", "dit",
        "--lora_target_modules", target_modules, "--lora_rank", "4", "--learning_rate", "1e-2",
        "--torch_dtype", "float32", "--seed", "0", "--num_epochs", "1", "--output_path", str(output), *extra,
    ]  # fmt: skip
    try:
        trainer.main(pipeline_class, argv, video=video)
    finally:
        reset_accelerate_state()
    return output / "epoch-0.safetensors"


def linked_model_root(tiny_root: Path, root: Path, aliases: dict[str, str]) -> Path:
    """``root`` holding links to every tiny repo, plus ``{release id: tiny repo id}`` aliases: releases that share a
    tiny repo's layout under their own ids."""
    for owner in tiny_root.iterdir():
        if not owner.is_dir():  # the ".built" marker of the shared build
            continue
        (root / owner.name).mkdir()
        for repo in owner.iterdir():
            (root / owner.name / repo.name).symlink_to(repo, target_is_directory=True)
    for release, tiny in aliases.items():
        (root / release).parent.mkdir(exist_ok=True)  # an owner without tiny repos of its own (PAI)
        (root / release).symlink_to(tiny_root / tiny, target_is_directory=True)
    return root


SMALL = {"--num_epochs": "1", "--dataset_repeat": "1", "--max_pixels": "4096", "--height": "32", "--width": "32"}


def small(argv: list[str], changes: dict[str, str] | None = None) -> list[str]:
    """``argv`` with the sizes, epochs and repeat count (and ``changes``) replaced where the command has them."""
    changes = {**SMALL, **(changes or {})}
    argv = list(argv)
    for index, word in enumerate(argv[:-1]):
        if word in changes:
            argv[index + 1] = changes[word]
    return argv


def config_file(words: list[str]) -> Path | None:
    """The ``--config_file`` of an ``accelerate launch`` command, or None."""
    launcher = words[:words.index(next(word for word in words if word.endswith("train.py")))]
    return REPO / launcher[launcher.index("--config_file") + 1] if "--config_file" in launcher else None


def script_commands(training: Path, relative: str, changes: dict[str, str] | None = None,
                    text: str | None = None) -> list[tuple[Path | None, list[str]]]:
    """``(accelerate config or None, trainer argv)`` of each launch command of the script ``training / relative``
    (or of ``text``, read from it), each launching ``training / train.py``, sizes made small (``small``)."""
    from tests.examples.test_scripts import launch_commands, trainer_argv

    found = []
    for words in launch_commands((training / relative).read_text() if text is None else text):
        train_py, argv = trainer_argv(words)
        assert train_py == training / "train.py", shlex.join(words)
        found.append((config_file(words), small(argv, changes)))
    return found


def draw_dataset(argv: list[str], edit_inputs: str | None = None, **edit) -> None:
    """Draws a two-sample dataset where a raw-data command expects one (stage 2 reads the cache instead): reference
    images drawn by ``build_example_edit_dataset(**edit)`` for a command whose ``--extra_inputs`` is ``edit_inputs``,
    else plain images."""
    args = build_parser().parse_args(argv)
    if args.task.endswith(":train") or Path(args.dataset_metadata_path).is_file():
        return
    if edit_inputs is not None and args.extra_inputs == edit_inputs:
        build_example_edit_dataset(args.dataset_base_path, num_samples=2, **edit)
    else:
        build_example_dataset(args.dataset_base_path, num_images=2)


def run_command(pipeline_class: type, argv: list[str], draw: Callable[[list[str]], None] = draw_dataset,
                video: bool = False) -> dict:
    """A launch command's trainer run in this process (a video trainer's with ``video``), after ``draw(argv)`` drew
    the dataset it expects; no accelerate state is left behind."""
    draw(argv)
    try:
        return trainer.main(pipeline_class, argv, video=video)
    finally:
        reset_accelerate_state()


def lora_update(path: Path) -> float:
    """The largest ``lora_B`` entry of a LoRA file (0 for an untrained LoRA)."""
    return max(value.abs().max().item() for key, value in load_file(str(path)).items() if "lora_B" in key)


def assert_deepspeed_config(path: Path, stage: int, offload: str | None = None) -> None:
    """``path`` is a DeepSpeed config accelerate's own reader accepts: 8 processes in bf16, ZeRO ``stage``, and the
    optimizer on ``offload`` unless None."""
    from accelerate.commands.config.config_args import ClusterConfig

    config = ClusterConfig.from_yaml_file(str(path))
    assert config.distributed_type == "DEEPSPEED" and config.num_processes == 8 and config.mixed_precision == "bf16"
    assert config.deepspeed_config["zero_stage"] == stage
    if offload is not None:
        assert config.deepspeed_config["offload_optimizer_device"] == offload
