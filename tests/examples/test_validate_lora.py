"""``validate_lora/Qwen-Image.py`` on the tiny Qwen-Image: it renders, at the asked size, with the LoRA's effect.

The LoRA comes from a one-epoch run of the trainer on a two-image dataset, with a learning rate high enough that
the merged weights visibly change the image.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from diffsynth.core.data.example_dataset import build_example_dataset
from diffsynth.core.loader.tiny_models import QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS
from diffsynth.diffusion import trainer
from diffsynth.pipelines.qwen_image import QwenImagePipeline

SCRIPT = Path(__file__).resolve().parents[2] / "examples/qwen_image/model_training/validate_lora/Qwen-Image.py"
MODELS = ",".join(f"{QWEN_IMAGE_MODEL_ID}:{QWEN_IMAGE_PATTERNS[name]}" for name in ("dit", "text_encoder", "vae"))
RENDER = ["--height", "64", "--width", "48", "--steps", "2", "--device", "cpu", "--torch_dtype", "float32"]


def load_script():
    spec = importlib.util.spec_from_file_location("validate_qwen_image_lora", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def lora_file(base, tmp_path) -> Path:
    from accelerate.state import AcceleratorState, GradientState

    metadata = build_example_dataset(tmp_path / "dataset", num_images=2)
    output = tmp_path / "train"
    argv = [
        "--dataset_base_path", str(metadata.parent), "--dataset_metadata_path", str(metadata),
        "--max_pixels", "4096", "--model_id_with_origin_paths", MODELS, "--lora_base_model", "dit",
        "--lora_target_modules", "to_q,to_k,to_v", "--lora_rank", "4", "--learning_rate", "1e-2",
        "--torch_dtype", "float32", "--seed", "0", "--num_epochs", "1", "--output_path", str(output),
    ]  # fmt: skip
    try:
        trainer.main(QwenImagePipeline, argv)
    finally:  # the next in-process run builds its own Accelerator, as a separate launch would
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
    return output / "epoch-0.safetensors"


def test_default_models_are_the_trained_ones():
    assert load_script().MODEL_ID_WITH_ORIGIN_PATHS == MODELS


def test_renders_with_the_lora_merged(lora_file, tmp_path, capsys):
    script = load_script()
    with_lora = script.main(["--lora_path", str(lora_file), "--output", str(tmp_path / "lora.png"), *RENDER])
    assert with_lora == tmp_path / "lora.png"
    assert f"image written to {with_lora.resolve()}" in capsys.readouterr().out
    without = script.main(["--lora_path", str(lora_file), "--lora_alpha_scale", "0", "--output",
                           str(tmp_path / "base.png"), "--model_id_with_origin_paths", MODELS, *RENDER])
    images = [np.asarray(Image.open(path).convert("RGB"), dtype=np.int16) for path in (with_lora, without)]
    assert images[0].shape == (64, 48, 3)
    assert np.abs(images[0] - images[1]).max() > 0, "the LoRA left the image unchanged"


def test_missing_lora_fails_before_loading(base, tmp_path, capsys):
    with pytest.raises(SystemExit):
        load_script().main(["--lora_path", str(tmp_path / "missing.safetensors"), *RENDER])
    assert "--lora_path" in capsys.readouterr().err
