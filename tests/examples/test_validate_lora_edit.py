"""``validate_lora/Qwen-Image-Edit.py`` on the tiny Edit repos: input image + prompt -> an edited image, with the
LoRA's effect.

The LoRA comes from a one-epoch run of the trainer on a two-sample edit dataset, with a learning rate high enough
that the merged weights visibly change the image. Edit images are sized to 64 x 64 pixels instead of 1024 x 1024.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from diffsynth.core.data.example_edit_dataset import build_example_edit_dataset
from diffsynth.testing.tiny_models import (
    QWEN_IMAGE_EDIT_2509_MODEL_ID,
    QWEN_IMAGE_EDIT_MODEL_ID,
    QWEN_IMAGE_MODEL_ID,
    QWEN_IMAGE_PATTERNS,
)
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.pipelines.qwen_image.edit import edit_image_size

from .helpers import load_script as load_script_at
from .helpers import train_lora

SCRIPT = "examples/qwen_image/model_training/validate_lora/Qwen-Image-Edit.py"
SHARED = [f"{QWEN_IMAGE_MODEL_ID}:{QWEN_IMAGE_PATTERNS[name]}" for name in ("text_encoder", "vae")]
RENDER = ["--steps", "2", "--device", "cpu", "--torch_dtype", "float32", "--prompt", "make the circle blue"]


def models(model_id):
    return ",".join([f"{model_id}:{QWEN_IMAGE_PATTERNS['dit']}", *SHARED])


def load_script():
    return load_script_at(SCRIPT, "validate_qwen_image_edit_lora")


@pytest.fixture(autouse=True)
def small_edit_images(monkeypatch):
    monkeypatch.setattr(QwenImagePipeline, "edit_image_pixels", 64 * 64)
    monkeypatch.setattr(QwenImagePipeline, "edit_condition_pixels", 64 * 64)


@pytest.fixture
def trained(base, tmp_path) -> tuple[Path, Path]:
    """A LoRA trained on a one-edit-image dataset, and that dataset's metadata file."""
    metadata = build_example_edit_dataset(tmp_path / "dataset", num_samples=2, num_edit_images=1)
    lora = train_lora(QwenImagePipeline, metadata, models(QWEN_IMAGE_EDIT_MODEL_ID), tmp_path / "train",
                      "to_q,to_k,to_v", extra=["--data_file_keys", "image,edit_image", "--extra_inputs", "edit_image"])
    return lora, metadata


def test_default_models_are_the_ones_the_edit_script_trains():
    assert load_script().MODEL_ID_WITH_ORIGIN_PATHS == models(QWEN_IMAGE_EDIT_MODEL_ID)


def test_edits_the_image_with_the_lora_merged(trained, tmp_path, capsys):
    lora, metadata = trained
    edit_image = str(metadata.parent / "edit_000_1.png")
    script = load_script()
    with_lora = script.main(["--lora_path", str(lora), "--edit_image", edit_image, "--output",
                             str(tmp_path / "lora.png"), *RENDER])
    assert f"image written to {with_lora.resolve()}" in capsys.readouterr().out
    without = script.main(["--lora_path", str(lora), "--lora_alpha_scale", "0", "--edit_image", edit_image,
                           "--output", str(tmp_path / "base.png"), *RENDER])
    images = [np.asarray(Image.open(path).convert("RGB"), dtype=np.int16) for path in (with_lora, without)]
    # The size follows the edit image's aspect ratio (64 x 64 pixels here, instead of 1024 x 1024).
    width, height = edit_image_size(Image.open(edit_image), 64 * 64)
    assert images[0].shape[:2] == (height, width)
    assert np.abs(images[0] - images[1]).max() > 0, "the LoRA left the image unchanged"


def test_several_edit_images_go_to_edit_2509_as_a_list(trained, tmp_path):
    lora, metadata = trained
    edits = [str(metadata.parent / "edit_000_1.png"), str(metadata.parent / "edit_001_1.png")]
    output = load_script().main(["--lora_path", str(lora), "--edit_image", edits[0], "--edit_image", edits[1],
                                 "--model_id_with_origin_paths", models(QWEN_IMAGE_EDIT_2509_MODEL_ID),
                                 "--height", "32", "--width", "48", "--output", str(tmp_path / "pair.png"), *RENDER])
    assert Image.open(output).size == (48, 32)


def test_missing_inputs_fail_before_loading(base, tmp_path, capsys):
    with pytest.raises(SystemExit):
        load_script().main(["--lora_path", str(tmp_path / "missing.safetensors"), "--edit_image", "x.png", *RENDER])
    assert "--lora_path" in capsys.readouterr().err
    (tmp_path / "lora.safetensors").write_bytes(b"")
    with pytest.raises(SystemExit):
        load_script().main(["--lora_path", str(tmp_path / "lora.safetensors"), "--edit_image", "x.png", *RENDER])
    assert "--edit_image x.png: no such file" in capsys.readouterr().err
