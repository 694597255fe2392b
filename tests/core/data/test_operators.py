"""Image sizing (fixed and under max_pixels), centre cropping, decoding, and the extension lookup."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from diffsynth.core.data import DatasetError, ResizeConfig, operator_for, resize_and_crop
from diffsynth.core.data.operators import IMAGE_EXTENSIONS, check_image, load_image


@pytest.mark.parametrize("kwargs, names", [
    ({"height": 100, "width": 128}, ["--height", "100", "96"]),
    ({"height": 128, "width": 0}, ["--width", "0"]),
    ({"height": 128, "width": 120.0}, ["--width", "120.0"]),
    ({"height": 128}, ["--height", "--width", "both"]),
    ({"width": 128}, ["--width", "--height", "both"]),
    ({"max_pixels": 100}, ["--max_pixels", "100", "256"]),
    ({"division_factor": 0}, ["division_factor", "0"]),
])
def test_bad_sizes_name_the_flag_value_and_fix(kwargs, names):
    with pytest.raises(DatasetError) as error:
        ResizeConfig(**kwargs)
    for name in names:
        assert name in str(error.value)


def test_division_factor_is_configurable():
    config = ResizeConfig(height=24, width=40, division_factor=8)
    assert config.target_size(1000, 10, "x.png") == (40, 24)
    assert ResizeConfig(division_factor=8).target_size(100, 50, "x.png") == (96, 48)


@pytest.mark.parametrize("size, max_pixels, expected", [
    ((1000, 500), 1024 * 1024, (992, 496)),        # under budget: only rounded down to multiples of 16
    ((4000, 3000), 1024 * 1024, (1168, 880)),      # scaled by sqrt(1048576 / 12e6), then rounded down
    ((512, 512), 512 * 512, (512, 512)),           # exactly at the budget: untouched
    ((100, 30), 1024 * 1024, (96, 16)),
])
def test_dynamic_target_size(size, max_pixels, expected):
    assert ResizeConfig(max_pixels=max_pixels).target_size(*size, source="x.png") == expected


@settings(max_examples=200, deadline=None)
@given(width=st.integers(16, 20000), height=st.integers(16, 20000), max_pixels=st.integers(256, 4_000_000))
def test_dynamic_target_is_within_budget_multiple_of_16_and_keeps_aspect(width, height, max_pixels):
    config = ResizeConfig(max_pixels=max_pixels)
    try:
        target_width, target_height = config.target_size(width, height, "x.png")
    except DatasetError as error:
        assert "x.png" in str(error)
        assert min(width, height) * min(1.0, (max_pixels / (width * height)) ** 0.5) < 16
        return
    assert target_width % 16 == 0 and target_height % 16 == 0
    assert 0 < target_width <= width and 0 < target_height <= height
    assert target_width * target_height <= max_pixels
    # Rounding down to 16 loses at most 16 pixels a side, so the aspect ratio moves only that much.
    scale = min(1.0, (max_pixels / (width * height)) ** 0.5)
    assert width * scale - 16 < target_width and height * scale - 16 < target_height


def test_a_side_that_would_round_to_zero_names_the_image_and_the_fix():
    with pytest.raises(DatasetError) as error:
        ResizeConfig().target_size(10, 5000, "data/thin.png")
    message = str(error.value)
    assert "data/thin.png" in message and "10x5000" in message
    assert "--height" in message and "remove its row" in message


def test_fixed_size_ignores_the_image_size_and_max_pixels():
    config = ResizeConfig(height=64, width=32, max_pixels=256)
    assert config.target_size(5, 5000, "x.png") == (32, 64)


@settings(max_examples=40, deadline=None)
@given(width=st.integers(1, 300), height=st.integers(1, 300), target_width=st.sampled_from([16, 48, 128, 320]),
       target_height=st.sampled_from([16, 64, 96, 320]))
def test_resize_and_crop_always_gives_exactly_the_target(width, height, target_width, target_height):
    image = Image.new("RGB", (width, height), (10, 20, 30))
    result = resize_and_crop(image, target_width, target_height)
    assert result.size == (target_width, target_height)


def stripes(width, height, colours):
    """Vertical stripes of equal width, one per colour."""
    image = Image.new("RGB", (width, height))
    stripe = width // len(colours)
    for index, colour in enumerate(colours):
        image.paste(colour, (index * stripe, 0, (index + 1) * stripe, height))
    return image


def test_crop_is_centred_and_the_scale_covers_the_target():
    red, green, blue = (255, 0, 0), (0, 255, 0), (0, 0, 255)
    # 300x200 -> scale 0.64 -> 192x128 -> crop 32 pixels off each side: red | green | blue becomes 32 | 64 | 32.
    result = resize_and_crop(stripes(300, 200, [red, green, blue]), 128, 128)
    assert result.size == (128, 128)
    assert result.getpixel((2, 64)) == red
    assert result.getpixel((64, 64)) == green
    assert result.getpixel((125, 64)) == blue
    assert result.getpixel((20, 64)) == red and result.getpixel((44, 64)) == green


def test_an_image_of_the_target_size_is_returned_unchanged():
    image = Image.new("RGB", (64, 32))
    assert resize_and_crop(image, 64, 32) is image


@pytest.mark.parametrize("mode", ["RGBA", "L", "P", "CMYK"])
def test_load_image_converts_to_rgb_and_sizes(tmp_path, mode):
    path = tmp_path / "picture.png" if mode != "CMYK" else tmp_path / "picture.jpg"
    Image.new(mode, (200, 100)).save(path)
    image = load_image(path, ResizeConfig())
    assert image.mode == "RGB" and image.size == (192, 96)
    assert load_image(path, ResizeConfig(height=32, width=48)).size == (48, 32)


def test_load_image_applies_the_exif_orientation(tmp_path):
    path = tmp_path / "sideways.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: the upright picture is 20 wide and 40 tall
    Image.new("RGB", (40, 20), (200, 10, 10)).save(path, exif=exif)
    assert load_image(path, ResizeConfig()).size == (16, 32)


def test_check_image_reads_the_header_and_rejects_non_images(tmp_path):
    good, bad = tmp_path / "good.png", tmp_path / "bad.png"
    Image.new("RGB", (64, 64)).save(good)
    bad.write_text("not an image")
    check_image(good, ResizeConfig())
    with pytest.raises(DatasetError) as error:
        check_image(bad, ResizeConfig())
    assert str(bad) in str(error.value) and "remove its row" in str(error.value)


def test_check_image_applies_the_size_rule(tmp_path):
    path = tmp_path / "thin.png"
    Image.new("RGB", (8, 400)).save(path)
    with pytest.raises(DatasetError, match="thin.png"):
        check_image(path, ResizeConfig())
    check_image(path, ResizeConfig(height=64, width=64))


def test_a_truncated_image_passes_the_header_check_and_fails_on_load_naming_the_file(tmp_path):
    path = tmp_path / "cut.png"
    Image.effect_noise((128, 128), 64).convert("RGB").save(path)
    path.write_bytes(path.read_bytes()[:400])
    check_image(path, ResizeConfig())
    with pytest.raises(DatasetError) as error:
        load_image(path, ResizeConfig())
    assert str(path) in str(error.value)


@pytest.mark.parametrize("extension", IMAGE_EXTENSIONS + (".PNG", ".JPG"))
def test_image_extensions_map_to_the_image_operator(extension):
    assert operator_for(f"a/b{extension}", "image").kind == "image"


@pytest.mark.parametrize("name", ["clip.flv", "notes.txt", "no_extension"])
def test_unsupported_extension_names_the_file_key_and_supported_list(name):
    with pytest.raises(DatasetError) as error:
        operator_for(f"data/{name}", "video")
    message = str(error.value)
    assert f"data/{name}" in message and "'video'" in message
    assert ".png" in message and ".jpg" in message and "data_file_keys" in message
