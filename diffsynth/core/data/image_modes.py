"""Decoded images of every Pillow mode brought to 8-bit RGB as they look on screen.

Pillow's ``convert("RGB")`` is right for most modes but wrong for two kinds of file:

- **Deep images** (16-bit greyscale PNG and TIFF: ``I;16``, ``I;16B``, ``I;16L``, ``I;16N``; 32-bit integer TIFF:
  ``I``; float TIFF: ``F``). ``convert`` clips their values to 0..255, so a 16-bit picture turns almost all white.
  Here each value is scaled by the range of its format to 0..255 and rounded: 65535 for 16-bit, 1.0 for float, and
  for ``I`` the ``BitsPerSample`` and ``SampleFormat`` of its TIFF tags (``2**bits - 1``, or ``2**(bits - 1) - 1``
  when signed, negatives showing black; Pillow's signed 32-bit range without tags). The format's range, not the
  image's own minimum and maximum: a dark photograph must stay dark, a flat image must stay flat, and every image of
  a dataset must be scaled alike, none of which holds when each image is stretched to its own extremes.
- **Transparent images** (``LA``, ``La``, ``PA``, ``RGBA``, ``RGBa``, and ``1``/``L``/``P``/``RGB``/``I;16`` with a
  transparent colour in ``info["transparency"]``). ``convert`` drops the alpha channel and shows whatever colour the
  invisible pixels happen to hold, often black or noise. Here they are composited on ``TRANSPARENCY_BACKGROUND``,
  white: transparent training images are mostly cut-outs, logos and product shots made to be shown on white pages,
  and white is what the common viewers and browsers (in a light theme) show through them.

Every other accepted mode (``1``, ``L``, ``P``, ``RGB``, ``RGBX``, ``CMYK``, ``YCbCr``, ``LAB``, ``HSV``) converts
with Pillow's own formulas. ``ACCEPTED_MODES`` lists every mode Pillow 13 defines; a mode outside it (a newer
Pillow's, or a plugin's) is refused naming the file, since its appearance is unknown. Embedded ICC colour profiles
are not applied: a CMYK or wide-gamut file converts with the naive formulas.
"""

from __future__ import annotations

import os

import numpy as np
from PIL import ExifTags, Image, ImageOps

from .errors import DatasetError

TRANSPARENCY_BACKGROUND = (255, 255, 255)
_CONVERTED_DIRECTLY = ("1", "L", "P", "RGB", "RGBX", "CMYK", "YCbCr", "LAB", "HSV")
_WITH_ALPHA = ("LA", "La", "PA", "RGBA", "RGBa")
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N")
_DEEP = (*_SIXTEEN_BIT, "I", "F")
ACCEPTED_MODES = (*_CONVERTED_DIRECTLY, *_WITH_ALPHA, *_DEEP)
_TIFF_BITS_PER_SAMPLE, _TIFF_SAMPLE_FORMAT, _TIFF_SIGNED = 258, 339, 2


def check_mode(mode: str, source: str | os.PathLike) -> None:
    """Refuses a mode whose appearance this module does not know.

    Raises:
        DatasetError: ``mode`` is not in ``ACCEPTED_MODES``; the message names the file and the mode.
    """
    if mode not in ACCEPTED_MODES:
        raise DatasetError(
            f"image {source} decodes to the Pillow mode {mode!r}, which diffsynth cannot convert to RGB faithfully "
            f"(accepted: {', '.join(ACCEPTED_MODES)}); save it as an 8- or 16-bit PNG, or remove its row"
        )


def upright_rgb(image: Image.Image, source: str | os.PathLike) -> Image.Image:
    """A freshly opened ``image`` as 8-bit RGB, turned upright per its EXIF orientation.

    Deep modes are scaled by their format's range, transparency is composited on ``TRANSPARENCY_BACKGROUND`` (see the
    module docstring). Phones store photos sideways with an orientation tag, and captions describe the upright
    picture.

    Args:
        image: An image as ``Image.open`` returned it (its TIFF tags give a 32-bit image's range), of any mode in
            ``ACCEPTED_MODES``.
        source: Its file, named in errors.

    Raises:
        DatasetError: The mode is not accepted.
    """
    check_mode(image.mode, source)
    top = _range_top(image) if image.mode in _DEEP else None  # read first: a transposed copy has no TIFF tags
    image = ImageOps.exif_transpose(image)
    transparent = image.info.get("transparency")
    if top is not None:
        # float32 holds 16- and 32-bit values to far better than an 8-bit level, at half the memory of float64.
        scaled = np.clip(np.asarray(image, dtype=np.float32) / np.float32(top), 0.0, 1.0) * 255.0
        grey = Image.fromarray(np.rint(scaled).astype(np.uint8), "L")
        if transparent is None or image.mode == "F":
            return grey.convert("RGB")
        # A 16-bit file's transparent colour is a 16-bit value; match it before scaling merges neighbours.
        alpha = np.where(np.asarray(image) == transparent, 0, 255).astype(np.uint8)
        return _composite(Image.merge("LA", (grey, Image.fromarray(alpha, "L"))))
    if image.mode in _WITH_ALPHA or transparent is not None:
        if image.mode == "La":
            image = image.convert("LA")  # Pillow converts premultiplied grey only to LA
        return _composite(image)
    return image.convert("RGB")


def upright_size(image: Image.Image) -> tuple[int, int]:
    """The ``(width, height)`` of an opened ``image`` once ``upright_rgb`` has turned it, read from its header: EXIF
    orientations 5 to 8 turn it by a quarter (a PNG's EXIF stored after its pixels is not seen)."""
    if image.format == "PNG":
        # Pillow decodes a whole PNG to look for EXIF after its pixels; EXIF before them is read with the header.
        exif = Image.Exif()
        if image.info.get("exif"):
            exif.load(image.info["exif"])
    else:
        exif = image.getexif()
    orientation = exif.get(ExifTags.Base.Orientation, 1)
    return tuple(reversed(image.size)) if orientation in (5, 6, 7, 8) else image.size


def _composite(image: Image.Image) -> Image.Image:
    background = Image.new("RGBA", image.size, (*TRANSPARENCY_BACKGROUND, 255))
    return Image.alpha_composite(background, image.convert("RGBA")).convert("RGB")


def _range_top(image: Image.Image) -> float:
    """The value that shows as white in a deep image: 1.0 for float, 65535 for 16-bit, else from the TIFF tags.

    A mode-``I`` image without TIFF tags holds Pillow's signed 32-bit values. Values below 0 (signed formats) show as
    black.
    """
    if image.mode == "F":
        return 1.0
    if image.mode in _SIXTEEN_BIT:
        return 65535.0
    tags = getattr(image, "tag_v2", None)
    if not tags:
        return float(2**31 - 1)
    bits, sample_format = tags.get(_TIFF_BITS_PER_SAMPLE, 32), tags.get(_TIFF_SAMPLE_FORMAT, 1)
    bits = int(bits[0] if isinstance(bits, tuple) else bits)
    signed = (sample_format[0] if isinstance(sample_format, tuple) else sample_format) == _TIFF_SIGNED
    return float(2 ** (bits - 1) - 1 if signed else 2**bits - 1)
