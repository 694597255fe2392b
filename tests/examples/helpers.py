"""Pieces the example-script tests share: loading a script by path and running the trainer in-process."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from diffsynth.training import entry as trainer
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
        (root / owner.name).mkdir()
        for repo in owner.iterdir():
            (root / owner.name / repo.name).symlink_to(repo, target_is_directory=True)
    for release, tiny in aliases.items():
        (root / release).symlink_to(tiny_root / tiny, target_is_directory=True)
    return root
