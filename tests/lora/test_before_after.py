"""The before/after picture: panels where ``panel_boxes`` says, the difference scaled to white, sizes checked."""

import numpy as np
import pytest
from PIL import Image

from diffsynth.lora.before_after import GAP, before_after_image, difference, panel_boxes, save_before_after


def noise(seed, size=(40, 24)):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def test_the_panels_hold_both_renders_and_their_scaled_difference(tmp_path):
    before, after = noise(0), noise(1)
    path, stats = save_before_after(before, after, tmp_path / "before_after.png", "a caption long enough " * 8)
    expected = np.abs(np.asarray(before, dtype=np.int16) - np.asarray(after, dtype=np.int16))
    assert (stats.max, stats.mean) == (expected.max(), pytest.approx(expected.mean()))
    with Image.open(path) as image:
        assert image.format == "PNG" and image.width == 3 * 40 + 4 * GAP
        panels = [np.asarray(image.crop(box)) for box in panel_boxes(before.size)]
    assert np.array_equal(panels[0], np.asarray(before)) and np.array_equal(panels[1], np.asarray(after))
    assert np.array_equal(panels[2], (expected * (255 / expected.max())).astype(np.uint8))


def test_identical_renders_give_a_black_difference():
    image = noise(2)
    picture, stats = before_after_image(image, image.copy())
    assert (stats.max, stats.mean) == (0, 0.0) and stats.describe() == "mean |difference| 0.0, max 0 (of 255)"
    assert not np.asarray(picture.crop(panel_boxes(image.size)[2])).any()


def test_renders_of_different_sizes_are_refused():
    with pytest.raises(ValueError, match="differ in size"):
        difference(noise(0), noise(1, size=(24, 40)))
