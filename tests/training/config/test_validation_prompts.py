"""Images of validation entries are read as training reads its data: upright per EXIF, deep modes scaled, modes
Pillow cannot show faithfully refused with the entry named."""

import json

import numpy as np
import pytest
from PIL import Image

from diffsynth.training.config.validation_prompts import ValidationConfig, ValidationError, read_validation_prompts


def prompt_file(tmp_path, **images):
    (tmp_path / "prompts.json").write_text(json.dumps([{"prompt": "a photo", **images}]))
    return tmp_path / "prompts.json"


def test_a_photo_stored_sideways_renders_upright_at_the_bucket_of_its_upright_shape(tmp_path):
    # A phone photo: 400x200 pixels stored, EXIF orientation 6 (turn a quarter clockwise to show it): 200x400 upright.
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.new("RGB", (400, 200), (200, 30, 30)).save(tmp_path / "phone.jpg", exif=exif)
    prompts = read_validation_prompts(prompt_file(tmp_path, edit_image="phone.jpg"))
    config = ValidationConfig(tuple(prompts), every_steps=1, every_epochs=None, max_pixels=64 * 64)

    height, width = config.size(prompts[0], 16)
    edit = config.call_arguments(prompts[0], 16)["edit_image"]
    assert height > width and edit.size == (200, 400)


def test_a_sixteen_bit_image_is_scaled_not_clipped_to_white(tmp_path):
    Image.fromarray(np.full((32, 32), 16384, dtype=np.uint16)).save(tmp_path / "deep.png")
    prompts = read_validation_prompts(prompt_file(tmp_path, edit_image="deep.png"))
    config = ValidationConfig(tuple(prompts), every_steps=1, every_epochs=None, max_pixels=64 * 64)
    edit = np.asarray(config.call_arguments(prompts[0], 16)["edit_image"])
    assert 60 <= edit.mean() <= 68  # 16384 of 65535 is a quarter of 255


def test_a_mode_without_a_faithful_conversion_is_refused_naming_the_entry(tmp_path, monkeypatch):
    from diffsynth.core.data import image_modes

    Image.new("RGB", (8, 8)).save(tmp_path / "odd.png")
    monkeypatch.setattr(image_modes, "ACCEPTED_MODES", ("L",))
    with pytest.raises(ValidationError) as raised:
        read_validation_prompts(prompt_file(tmp_path, edit_image="odd.png"))
    assert "entry 1" in str(raised.value) and "odd.png" in str(raised.value) and "'RGB'" in str(raised.value)


@pytest.mark.parametrize("value", ["a dog on a beach", "sks", "  photo of sks dog, 1girl  ", "a long prompt " * 40],
                         ids=["words", "one word", "spaces around", "too long for a file name"])
def test_a_value_that_names_no_file_and_no_path_is_the_one_prompt(tmp_path, monkeypatch, value):
    # kohya and ai-toolkit users pass the prompt itself.
    monkeypatch.chdir(tmp_path)
    assert [prompt.prompt for prompt in read_validation_prompts(value)] == [value.strip()]


def test_an_existing_file_is_read_whatever_its_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sks").write_text("a red circle\na blue square\n")
    assert [prompt.prompt for prompt in read_validation_prompts("sks")] == ["a red circle", "a blue square"]


@pytest.mark.parametrize("value", ["prompts.txt", "my prompts.json", "val.CSV", "samples/prompts", r"C:\prompts"])
def test_a_missing_file_that_looks_like_a_path_is_an_error_naming_it(tmp_path, monkeypatch, value):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValidationError) as raised:
        read_validation_prompts(value)
    fix = ("fix the path to the .txt file (one prompt per line) or the .json list, or pass the prompt itself in quotes "
           "(e.g. --validation_prompts 'a dog on a beach')")
    assert raised.value.problems == [f"--validation_prompts {value} does not exist; {fix}"]


def test_an_empty_value_is_refused():
    with pytest.raises(ValidationError, match="--validation_prompts ' ' is empty; pass a prompt in quotes"):
        read_validation_prompts(" ")


def test_a_first_last_frame_entry_passes_both_images_and_a_missing_one_is_named(tmp_path):
    Image.new("RGB", (48, 32), (200, 30, 30)).save(tmp_path / "first.png")
    Image.new("RGB", (48, 32), (30, 30, 200)).save(tmp_path / "last.png")
    prompts = read_validation_prompts(prompt_file(tmp_path, input_image="first.png", end_image="last.png"))
    config = ValidationConfig(tuple(prompts), every_steps=1, every_epochs=None, max_pixels=64 * 64)
    arguments = config.call_arguments(prompts[0], 16)
    assert arguments["input_image"].getpixel((0, 0)) == (200, 30, 30)
    assert arguments["end_image"].getpixel((0, 0)) == (30, 30, 200)
    with pytest.raises(ValidationError, match="end_image"):
        read_validation_prompts(prompt_file(tmp_path, input_image="first.png", end_image="gone.png"))


def test_video_inputs_are_read_at_the_render_size_and_frame_count(tmp_path):
    from diffsynth.core.data.example_dataset import write_gif

    frames = [Image.new("RGB", (40, 24), (index * 30, 0, 0)) for index in range(7)]
    write_gif(tmp_path / "control.gif", frames)
    Image.new("RGB", (40, 24), (0, 0, 200)).save(tmp_path / "ref.png")
    prompts = read_validation_prompts(prompt_file(tmp_path, vace_video="control.gif",
                                                  vace_reference_image=["ref.png", "ref.png"]))
    config = ValidationConfig(tuple(prompts), every_steps=1, every_epochs=None, max_pixels=48 * 32,
                              fixed_size=(32, 48), max_frames=5)
    arguments = config.call_arguments(prompts[0], 16)
    assert len(arguments["vace_video"]) == 5 and arguments["vace_video"][0].size == (48, 32)
    assert [image.size for image in arguments["vace_reference_image"]] == [(40, 24)] * 2


def test_a_video_input_that_is_no_video_file_is_refused_naming_the_key(tmp_path):
    Image.new("RGB", (8, 8)).save(tmp_path / "still.png")
    with pytest.raises(ValidationError, match='"vace_video_mask" .*still.png is not a video file'):
        read_validation_prompts(prompt_file(tmp_path, vace_video_mask="still.png"))
