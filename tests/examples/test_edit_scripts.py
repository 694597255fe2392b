"""The three Qwen-Image-Edit LoRA scripts run as written on the tiny repos: only the dataset, sizes, epochs and the
output folder change.

Each script's ``accelerate launch`` command is read from the file and its trainer arguments go through
``trainer.main`` in this process, with ``DIFFSYNTH_MODEL_BASE_PATH`` on the tiny repos. The edit images are sized to
64 x 64 pixels (``edit_image_pixels``) instead of the reference's 1024 x 1024, which would cost the tiny VAE seconds
per sample on a CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from diffsynth.core.data.example_edit_dataset import build_example_edit_dataset
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.training import entry as trainer
from tests.conftest import reset_accelerate_state

from .test_scripts import launch_commands, trainer_argv

REPO = Path(__file__).resolve().parents[2]
LORA = REPO / "examples" / "qwen_image" / "model_training" / "lora"


def replaced(argv: list[str], values: dict[str, str]) -> list[str]:
    """``argv`` with the value after each flag in ``values`` replaced; every such flag must be in the script."""
    argv = list(argv)
    for flag, value in values.items():
        assert flag in argv, f"the script has no {flag}"
        argv[argv.index(flag) + 1] = value
    return argv


@pytest.mark.parametrize(("script", "num_edit_images"), [("Qwen-Image-Edit.sh", 1), ("Qwen-Image-Edit-2509.sh", 2),
                                                         ("Qwen-Image-Edit-2511.sh", 2)])
def test_edit_script_trains_a_lora_on_the_tiny_repos(script, num_edit_images, base, tmp_path, monkeypatch,
                                                     fresh_accelerate_state):
    monkeypatch.setattr(QwenImagePipeline, "edit_image_pixels", 64 * 64)
    monkeypatch.setattr(QwenImagePipeline, "edit_condition_pixels", 64 * 64)
    [words] = launch_commands((LORA / script).read_text())
    train_py, argv = trainer_argv(words)
    assert train_py == REPO / "examples" / "qwen_image" / "model_training" / "train.py"
    metadata = build_example_edit_dataset(tmp_path / "data", num_samples=2, num_edit_images=num_edit_images)
    metadata = metadata.parent / Path(argv[argv.index("--dataset_metadata_path") + 1]).name  # the script's format
    argv = replaced(argv, {
        "--dataset_base_path": str(metadata.parent), "--dataset_metadata_path": str(metadata),
        "--max_pixels": "4096", "--dataset_repeat": "1", "--num_epochs": "1", "--output_path": str(tmp_path / "out"),
    })  # fmt: skip
    try:
        result = trainer.main(QwenImagePipeline, argv)
    finally:
        reset_accelerate_state()
    assert result["global_step"] == 2
    pipe = result["module"].pipe
    assert pipe.processor is not None and pipe.dit.zero_cond_t is ("2511" in script)
    weights = load_file(str(tmp_path / "out" / "epoch-0.safetensors"))
    assert weights and all(key.startswith("diffusion_model.transformer_blocks.") for key in weights)
    assert max(value.abs().max().item() for key, value in weights.items() if "lora_B" in key) > 0
