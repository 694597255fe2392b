"""``validate_lora/Qwen-Image.py`` on the tiny Qwen-Image: it renders, at the asked size, with the LoRA's effect.

The LoRA comes from a one-epoch run of the trainer on a two-image dataset, with a learning rate high enough that
the merged weights visibly change the image.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from diffsynth.core.data.example_dataset import build_example_dataset
from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS
from diffsynth.lora.before_after import panel_boxes
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline

from .helpers import load_script as load_script_at
from .helpers import train_lora

SCRIPT = "examples/qwen_image/model_training/validate_lora/Qwen-Image.py"
MODELS = ",".join(f"{QWEN_IMAGE_MODEL_ID}:{QWEN_IMAGE_PATTERNS[name]}" for name in ("dit", "text_encoder", "vae"))
RENDER = ["--height", "64", "--width", "48", "--steps", "2", "--device", "cpu", "--torch_dtype", "float32"]


def load_script():
    return load_script_at(SCRIPT, "validate_qwen_image_lora")


@pytest.fixture
def lora_file(base, tmp_path) -> Path:
    metadata = build_example_dataset(tmp_path / "dataset", num_images=2)
    return train_lora(QwenImagePipeline, metadata, MODELS, tmp_path / "train", "to_q,to_k,to_v")


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


def test_before_after_renders_both_from_one_load_and_shows_their_difference(lora_file, tmp_path, capsys):
    picture = tmp_path / "before_after.png"
    load_script().main(["--lora_path", str(lora_file), "--output", str(tmp_path / "lora.png"), "--before_after",
                        str(picture), "--caption", "random weights draw noise", *RENDER])
    assert "without and with the LoRA, and their difference (mean |difference| " in capsys.readouterr().out
    with Image.open(picture) as image:
        assert image.format == "PNG"
        before, after, difference = (np.asarray(image.crop(box).convert("RGB"), dtype=np.int16)
                                     for box in panel_boxes((48, 64)))
    # The middle panel is the --output render; the left one the same seed without the LoRA.
    assert np.array_equal(after, np.asarray(Image.open(tmp_path / "lora.png").convert("RGB"), dtype=np.int16))
    assert np.abs(after - before).max() > 0 and difference.max() == 255
    without = load_script().main(["--lora_path", str(lora_file), "--lora_alpha_scale", "0", "--output",
                                  str(tmp_path / "base.png"), *RENDER])
    assert np.array_equal(before, np.asarray(Image.open(without).convert("RGB"), dtype=np.int16))
