"""Validation entries with the Wan Fun Control inputs: the control clip decoded like training's videos at the render's
size and length, the reference image opened, the camera motion passed on; wrong values refused before any model
loads, naming the entry and the key."""

import json

import numpy as np
import pytest
from PIL import Image

from diffsynth.core.data.example_dataset import build_example_video_dataset
from diffsynth.training.config.validation_prompts import ValidationConfig, ValidationError, read_validation_prompts


def entries(tmp_path, **keys):
    (tmp_path / "prompts.json").write_text(json.dumps([{"prompt": "a cat", "height": 32, "width": 48, **keys}]))
    return tmp_path / "prompts.json"


def test_a_control_entry_renders_with_its_clip_image_and_camera(tmp_path):
    build_example_video_dataset(tmp_path, num_videos=1, num_frames=9, size=(64, 48))
    Image.new("RGB", (20, 10), (200, 10, 10)).save(tmp_path / "look.png")
    (prompt,) = read_validation_prompts(entries(tmp_path, control_video="video_000.mp4", reference_image="look.png",
                                                camera_control_direction="LeftUp", camera_control_speed=0.05))
    config = ValidationConfig((prompt,), every_steps=1, every_epochs=None, max_pixels=64 * 64, max_frames=5)
    arguments = config.call_arguments(prompt, 16)
    assert prompt.inputs() == {"control_video", "reference_image", "camera_control_direction",
                               "camera_control_speed"}
    control = arguments["control_video"]
    assert len(control) == arguments["num_frames"] == 5 and {frame.size for frame in control} == {(48, 32)}
    assert np.asarray(arguments["reference_image"]).reshape(-1, 3).mean(0).round().tolist() == [200, 10, 10]
    assert (arguments["camera_control_direction"], arguments["camera_control_speed"]) == ("LeftUp", 0.05)


@pytest.mark.parametrize(("keys", "message"), [
    ({"control_video": "missing.mp4"}, '"control_video"'),
    ({"control_video": "look.png"}, "not a video file"),
    ({"control_video": 3}, "give a path relative to the prompt file"),
    ({"camera_control_speed": "fast"}, '"camera_control_speed"'),
    ({"camera_control_direction": ""}, '"camera_control_direction"'),
    ({"reference_image": "missing.png"}, '"reference_image"'),
])  # fmt: skip
def test_wrong_control_values_are_refused_naming_the_key(tmp_path, keys, message):
    Image.new("RGB", (8, 8)).save(tmp_path / "look.png")
    with pytest.raises(ValidationError) as raised:
        read_validation_prompts(entries(tmp_path, **keys))
    assert "entry 1" in str(raised.value) and message in str(raised.value)
