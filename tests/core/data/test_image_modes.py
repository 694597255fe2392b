"""Every Pillow mode decodes to the RGB the picture shows: one picture saved in each mode against an 8-bit reference.

The references are computed here with numpy from the picture's values (grey levels, palette entries, alpha
compositing on white), never with the code under test. Tolerances, in 8-bit levels per channel: 0 where the mode
holds the picture exactly (1, L, P, RGB, RGBX, CMYK, the 16-bit modes, I, F); 1 for alpha compositing (rounding of
the blend); 2 for premultiplied alpha (La, RGBa: premultiplied values lose precision at low alpha); 3 for YCbCr and
HSV and 10 for LAB, which is what storing this picture's colours in those 8-bit colour spaces loses (their round trip
through Pillow, measured; LAB's a and b channels are coarse).
"""

import numpy as np
import pytest
from PIL import Image

from diffsynth.core.data import DatasetError, ResizeConfig
from diffsynth.core.data.image_modes import ACCEPTED_MODES, TRANSPARENCY_BACKGROUND, check_mode, upright_rgb
from diffsynth.core.data.operators import check_image, load_image

SIZE = (32, 16)  # width, height: 512 pixels, so the grey ramp below runs through every level twice
GREY = (np.arange(SIZE[0] * SIZE[1]) % 256).reshape(SIZE[1], SIZE[0]).astype(np.uint8)
ALPHA = ((np.arange(SIZE[0] * SIZE[1]) * 7) % 256).reshape(SIZE[1], SIZE[0]).astype(np.uint8)
# 64 colours inside 40..215, so that the colour-space modes (LAB above all) hold them without clipping.
PALETTE = np.array([(40 + (11 * i) % 176, 40 + (37 * i) % 176, 215 - (13 * i) % 176) for i in range(64)], np.uint8)
INDICES = ((np.arange(SIZE[0] * SIZE[1]) * 5) % 64).reshape(SIZE[1], SIZE[0]).astype(np.uint8)
COLOURS = PALETTE[INDICES]  # an RGB picture with 64 colours, exact in a palette


def grey_rgb(values):
    return np.repeat(values[..., None], 3, axis=2)


def on_white(rgb, alpha):
    """``rgb`` composited over the documented background by ``alpha``, rounded: the reference of a transparent image."""
    weight = alpha[..., None].astype(np.float64) / 255.0
    return np.rint(rgb * weight + np.array(TRANSPARENCY_BACKGROUND) * (1.0 - weight)).astype(np.uint8)


def palette_image(transparency=None):
    image = Image.fromarray(INDICES, "L").convert("P")
    image.putpalette(PALETTE.flatten().tolist())
    if transparency is not None:
        image.info["transparency"] = transparency
    return image


def picture(mode):
    """``(image in mode, file extension or None for in-memory only, reference RGB, tolerance)``."""
    grey_l = Image.fromarray(GREY, "L")
    alpha_l = Image.fromarray(ALPHA, "L")
    colour = Image.fromarray(COLOURS, "RGB")
    rgba = colour.copy()
    rgba.putalpha(alpha_l)
    grey_la = Image.merge("LA", (grey_l, alpha_l))
    sixteen = (GREY.astype(np.uint16) * 257).astype(np.uint16)
    palette_alpha = palette_image().convert("PA")
    palette_alpha.putalpha(alpha_l)
    cases = {
        "1": (grey_l.point(lambda v: 255 if v > 127 else 0).convert("1", dither=Image.Dither.NONE), ".png",
              grey_rgb(np.where(GREY > 127, 255, 0).astype(np.uint8)), 0),
        "L": (grey_l, ".png", grey_rgb(GREY), 0),
        "LA": (grey_la, ".png", on_white(grey_rgb(GREY), ALPHA), 1),
        "La": (grey_la.convert("La"), None, on_white(grey_rgb(GREY), ALPHA), 2),
        "P": (palette_image(), ".png", COLOURS, 0),
        "PA": (palette_alpha, ".tif", on_white(COLOURS, ALPHA), 1),
        "RGB": (colour, ".png", COLOURS, 0),
        "RGBA": (rgba, ".png", on_white(COLOURS, ALPHA), 1),
        "RGBa": (rgba.convert("RGBa"), None, on_white(COLOURS, ALPHA), 2),
        "RGBX": (colour.convert("RGBX"), None, COLOURS, 0),
        "CMYK": (colour.convert("CMYK"), ".tif", COLOURS, 0),
        "YCbCr": (colour.convert("YCbCr"), ".tif", COLOURS, 3),
        "LAB": (colour.convert("LAB"), ".tif", COLOURS, 10),
        "HSV": (colour.convert("HSV"), None, COLOURS, 3),
        "I;16": (Image.fromarray(sixteen), ".png", grey_rgb(GREY), 0),
        "I;16B": (Image.frombytes("I;16B", SIZE, sixteen.astype(">u2").tobytes()), ".tif", grey_rgb(GREY), 0),
        "I;16L": (Image.frombytes("I;16L", SIZE, sixteen.astype("<u2").tobytes()), None, grey_rgb(GREY), 0),
        "I;16N": (Image.frombytes("I;16N", SIZE, sixteen.astype("=u2").tobytes()), None, grey_rgb(GREY), 0),
        "I": (Image.fromarray(np.rint(GREY / 255.0 * (2**31 - 1)).astype(np.int32)), ".tif", grey_rgb(GREY), 0),
        "F": (Image.fromarray((GREY / 255.0).astype(np.float32)), ".tif", grey_rgb(GREY), 0),
    }
    return cases[mode]


def decode(image, extension, tmp_path):
    """What the loader produces: from a file when the mode can be saved (checking that it reopens in that mode)."""
    if extension is None:
        return np.asarray(upright_rgb(image, "in-memory"))
    path = tmp_path / f"picture{extension}"
    image.save(path)
    with Image.open(path) as reopened:
        assert reopened.mode == image.mode, f"{extension} reopened {image.mode} as {reopened.mode}"
    return np.asarray(load_image(path, ResizeConfig(height=SIZE[1], width=SIZE[0])))


@pytest.mark.parametrize("mode", ACCEPTED_MODES)
def test_every_accepted_mode_decodes_to_the_rgb_the_picture_shows(mode, tmp_path):
    image, extension, reference, tolerance = picture(mode)
    assert image.mode == mode
    got = decode(image, extension, tmp_path)
    assert got.shape == reference.shape and got.dtype == np.uint8
    difference = np.abs(got.astype(int) - reference.astype(int)).max()
    assert difference <= tolerance, f"{mode}: off by up to {difference} levels"


def test_a_16_bit_greyscale_png_is_scaled_not_clipped_to_white(tmp_path):
    # The issue: a dark 16-bit picture (levels 0 to 64 of 255) came out white, since convert("RGB") clips at 255.
    dark = (GREY // 4).astype(np.uint16) * 257
    path = tmp_path / "dark16.png"
    Image.fromarray(dark).save(path)
    with Image.open(path) as opened:
        assert opened.mode == "I;16" and (np.asarray(opened.convert("RGB")) == 255).mean() > 0.98  # plain Pillow
    got = np.asarray(load_image(path, ResizeConfig(height=SIZE[1], width=SIZE[0])))
    assert np.array_equal(got, grey_rgb(GREY // 4))


@pytest.mark.parametrize("mode", ["P", "RGB", "L", "I;16"])
def test_the_transparent_colour_of_a_palette_grey_rgb_or_16_bit_file_shows_the_background(mode, tmp_path):
    image, hidden, shown, colour = {
        "P": (palette_image(), INDICES == 0, COLOURS, 0),
        "RGB": (Image.fromarray(COLOURS, "RGB"), (INDICES == 0), COLOURS, tuple(int(v) for v in PALETTE[0])),
        "L": (Image.fromarray(GREY, "L"), GREY == 9, grey_rgb(GREY), 9),
        "I;16": (Image.fromarray(GREY.astype(np.uint16) * 257), GREY == 9, grey_rgb(GREY), 9 * 257),
    }[mode]
    path = tmp_path / "transparent.png"
    image.save(path, transparency=colour)
    with Image.open(path) as reopened:
        assert reopened.mode == mode and reopened.info["transparency"] == colour
    got = np.asarray(load_image(path, ResizeConfig(height=SIZE[1], width=SIZE[0])))
    expected = np.where(hidden[..., None], np.array(TRANSPARENCY_BACKGROUND, np.uint8), shown)
    assert hidden.any() and np.array_equal(got, expected)


def test_partly_transparent_palette_entries_are_blended(tmp_path):
    alphas = bytes((i * 4) % 256 for i in range(64))
    path = tmp_path / "palette_alpha.png"
    palette_image().save(path, transparency=alphas)
    got = np.asarray(load_image(path, ResizeConfig(height=SIZE[1], width=SIZE[0])))
    expected = on_white(COLOURS, np.frombuffer(alphas, np.uint8)[INDICES])
    assert np.abs(got.astype(int) - expected.astype(int)).max() <= 1


def test_a_signed_16_bit_tiff_is_scaled_by_the_range_its_tags_declare(tmp_path):
    # Pillow opens signed 16-bit TIFFs as mode I (32-bit); white is their largest value, 32767, not 2**31 - 1.
    path = tmp_path / "signed16.tif"
    Image.fromarray(np.rint(GREY / 255.0 * 32767).astype(np.uint16)).save(path, tiffinfo={339: 2})
    with Image.open(path) as opened:
        assert opened.mode == "I" and opened.tag_v2[258] == (16,) and opened.tag_v2[339] == (2,)
    assert np.array_equal(np.asarray(load_image(path, ResizeConfig(height=SIZE[1], width=SIZE[0]))), grey_rgb(GREY))


def test_an_unknown_mode_is_refused_naming_the_file_and_mode():
    with pytest.raises(DatasetError) as error:
        check_mode("BGR;15", "data/odd.png")
    assert "data/odd.png" in str(error.value) and "'BGR;15'" in str(error.value)


def test_the_header_check_reports_the_pixels_a_decode_produces(tmp_path):
    path = tmp_path / "a.png"
    Image.new("I;16", (40, 24)).save(path)
    assert check_image(path, ResizeConfig()) == 40 * 24


@pytest.mark.parametrize("mode", ["RGB", "I;16"])
def test_the_exif_orientation_turns_the_picture_upright(mode, tmp_path):
    # Stored 64 wide and 32 tall with the left half bright; orientation 6 means "rotate 90 degrees clockwise to
    # show", so the upright picture is 32 wide and 64 tall with the bright half on top.
    values = np.zeros((32, 64), np.uint8)
    values[:, :32] = 200
    stored = Image.fromarray(values, "L").convert("RGB") if mode == "RGB" else Image.fromarray(
        values.astype(np.uint16) * 257)
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / "sideways.png"
    stored.save(path, exif=exif)
    got = np.asarray(load_image(path, ResizeConfig(height=64, width=32)))
    assert got.shape == (64, 32, 3)
    assert (got[:28] == 200).all() and (got[36:] == 0).all()
