"""File operators: turn one data file named by a metadata row into what a pipeline consumes.

Images are opened with PIL, turned upright and converted to RGB as they look (``image_modes``: 16-bit files scaled,
transparency on white), then brought to a size the VAE accepts, either a fixed
``--height`` x ``--width`` or, when those are not given, their own aspect ratio capped at ``--max_pixels`` with
each side rounded down to a multiple of 16. Resizing always scales to cover the target and then centre-crops, so the
aspect ratio is never distorted; at most a thin border is lost.

Operators are looked up by file extension in ``FILE_OPERATORS``: images here, videos (Wan) in ``video.py``. The
lookup ignores the column, so a ``.gif`` loads as a video (a list of frames) in any column, except for the sound
columns of ``audio.py`` (``input_audio``), whose files (a video among them) are read for their sound. An operator that needs
settings beyond the size (a video's ``num_frames``) names them in ``FileOperator.options`` and receives them as
keyword arguments. ``check`` returns the number of pixels ``load`` will decode, so the dataset can tell whether
decoding every file at start-up is affordable.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, ImageOps

from ..file_memo import parsed
from .audio import AUDIO_COLUMNS, check_audio, load_audio
from .buckets import bucket_sizes, nearest_bucket
from .errors import DatasetError
from .image_modes import check_mode, upright_rgb, upright_size
from .video import VIDEO_EXTENSIONS, check_video, load_video, video_shape

DEFAULT_MAX_PIXELS = 1024 * 1024
DEFAULT_DIVISION_FACTOR = 16
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff")
#: Raised whenever a change makes some file decode to other pixels (e.g. 16-bit images no longer clipped). It is part
#: of every stage-1 sample's fingerprint, so a rerun recomputes the samples cached under the old rules.
DECODE_RULES_VERSION = 2


@dataclass(frozen=True)
class ResizeConfig:
    """How images are sized, validated at construction.

    Attributes:
        height: Fixed output height (``--height``). Give it together with ``width`` or not at all.
        width: Fixed output width (``--width``).
        max_pixels: Without a fixed size, images larger than this many pixels are scaled down to it
            (``--max_pixels``). Bigger images cost quadratically more attention memory in the DiT.
        division_factor: Every output side is a multiple of this (16: VAE downsampling 8 x patch size 2).
        buckets: Without a fixed size, bring each image to its aspect-ratio bucket (``buckets``) instead of a size of
            its own, so that samples can share batches.
    """

    height: int | None = None
    width: int | None = None
    max_pixels: int = DEFAULT_MAX_PIXELS
    division_factor: int = DEFAULT_DIVISION_FACTOR
    buckets: bool = False

    def __post_init__(self) -> None:
        if not _is_positive_int(self.division_factor):
            raise DatasetError(f"division_factor={self.division_factor!r} must be a positive integer (default 16)")
        factor = self.division_factor
        for flag, value in (("--height", self.height), ("--width", self.width)):
            if value is None:
                continue
            if not _is_positive_int(value) or value % factor:
                suggestion = max(factor, round(value / factor) * factor) if _is_positive_int(value) else factor * 64
                raise DatasetError(
                    f"{flag} {value!r} must be a positive multiple of {factor} (the VAE and patch size need it); "
                    f"try {flag} {suggestion}"
                )
        if (self.height is None) != (self.width is None):
            given, missing = ("--height", "--width") if self.width is None else ("--width", "--height")
            raise DatasetError(
                f"{given} was given without {missing}; pass both for a fixed size, or neither to keep each image's "
                "aspect ratio under --max_pixels"
            )
        if not _is_positive_int(self.max_pixels) or self.max_pixels < factor * factor:
            raise DatasetError(
                f"--max_pixels {self.max_pixels!r} must be an integer of at least {factor * factor} "
                f"({factor}x{factor}); the default is {DEFAULT_MAX_PIXELS} (1024x1024)"
            )

    @property
    def fixed(self) -> bool:
        """True when every image is brought to ``width`` x ``height``."""
        return self.height is not None

    def target_size(self, width: int, height: int, source: str | os.PathLike, kind: str = "image") -> tuple[int, int]:
        """The ``(width, height)`` an image (or every frame of a video) of the given size is brought to.

        Args:
            width: The image's width in pixels.
            height: The image's height in pixels.
            source: The image's file, named in the error.
            kind: What the file holds (``"image"``, ``"video"``), named in the error.

        Raises:
            DatasetError: Without a fixed size or buckets, a side would round down to 0 (a very thin image).
        """
        if self.fixed:
            return self.width, self.height
        if self.buckets:
            return nearest_bucket(width, height, bucket_sizes(self.max_pixels, self.division_factor))
        scale = min(1.0, math.sqrt(self.max_pixels / (width * height)))
        factor = self.division_factor
        scaled = (int(width * scale), int(height * scale))
        target = (scaled[0] // factor * factor, scaled[1] // factor * factor)
        if 0 in target:
            raise DatasetError(
                f"{kind} {source} is {width}x{height} pixels; fitted under --max_pixels {self.max_pixels} it is "
                f"{scaled[0]}x{scaled[1]}, and a side under {factor} pixels rounds down to 0. Crop it to a less "
                "extreme aspect ratio, remove its row from the metadata, or pass --height and --width to bring every "
                f"{kind} to a fixed size"
            )
        return target


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def resize_and_crop(image: Image.Image, width: int, height: int) -> Image.Image:
    """Scales ``image`` to cover ``width`` x ``height`` keeping its aspect ratio, then centre-crops to exactly that.

    Args:
        image: Any PIL image.
        width: Output width in pixels.
        height: Output height in pixels.

    Returns:
        A new image of size ``(width, height)``, or ``image`` itself when it already has that size.
    """
    if image.size == (width, height):
        return image
    scale = max(width / image.width, height / image.height)
    # Rounding, not ceil: the side that sets the scale is then exactly its target even when the float product lands
    # a hair above it, and max() keeps the other side from rounding below its target.
    scaled = (max(width, round(image.width * scale)), max(height, round(image.height * scale)))
    image = image.resize(scaled, Image.Resampling.BICUBIC)
    left, top = (scaled[0] - width) // 2, (scaled[1] - height) // 2
    return image.crop((left, top, left + width, top + height))


IMAGE_HEADERS_REMEMBERED = 200_000
"""Image headers ``file_memo`` keeps (about 200 bytes each): the start-up check's reads serve bucketing afterwards."""


def _image_header(path: Path) -> tuple[tuple[int, int], str, tuple[int, int]]:
    """``(size, mode, upright size)`` from the header of ``path`` (``upright_size``: after EXIF orientation)."""
    with Image.open(path) as image:
        return image.size, image.mode, upright_size(image)


def read_image_header(path: Path) -> tuple[tuple[int, int], str, tuple[int, int]]:
    """``_image_header``, read once while the file is unchanged (``file_memo``)."""
    return parsed(path, "image header", _image_header, limit=IMAGE_HEADERS_REMEMBERED)


def check_image(path: Path, resize: ResizeConfig) -> int:
    """Reads only the header of ``path``: PIL must identify it, accept its mode, and its size give a non-empty target.

    Returns:
        The pixels a full decode produces (width x height), for the dataset's decode budget.
    """
    try:
        size, mode, _ = read_image_header(path)
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        raise DatasetError(
            f"{path} is not an image PIL can read ({error}); replace the file or remove its row from the metadata"
        ) from error
    check_mode(mode, path)
    resize.target_size(*size, source=path)
    return size[0] * size[1]


def image_shape(path: Path, resize: ResizeConfig) -> tuple[int, int]:
    """The ``(width, height)`` ``load_image`` gives ``path``, from its header (and EXIF orientation) alone: the one
    the dataset's check read, while the file is unchanged."""
    return resize.target_size(*read_image_header(path)[2], source=path)


def load_image(path: Path, resize: ResizeConfig, keep_alpha: bool = False) -> Image.Image:
    """Decodes ``path`` as RGB (RGBA with ``keep_alpha``: Qwen-Image-Layered trains on transparency), upright per its
    EXIF orientation, resized and cropped as ``resize`` says."""
    try:
        with Image.open(path) as opened:
            if keep_alpha:
                check_mode(opened.mode, path)
                image = ImageOps.exif_transpose(opened).convert("RGBA")
            else:
                image = upright_rgb(opened, path)
    except DatasetError:
        raise
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        raise DatasetError(
            f"could not decode image {path} ({error}); the file may be truncated: replace it or remove its row"
        ) from error
    return resize_and_crop(image, *resize.target_size(*image.size, source=path))


@dataclass(frozen=True)
class FileOperator:
    """The two things the dataset does with a data file of one kind.

    Both are called as ``check(path, resize, **settings)`` and ``load(path, resize, **settings)``, where
    ``settings`` holds the dataset options this operator names in ``options``.

    Attributes:
        kind: What the file holds, for messages (``"image"``).
        check: Fails fast on a file that cannot be loaded, reading as little of it as possible; returns the number
            of pixels ``load`` decodes (all frames of a video counted).
        load: Returns the decoded, resized content.
        options: Names of the dataset options (``"num_frames"``, ...) passed to ``check``, ``load`` and ``shape`` as
            keyword arguments; empty for operators that need only the size.
        shape: Returns the shape ``load`` gives (``(width, height)``, and the frame count for a video) without
            decoding the pixels, for batching samples of one shape; None for a kind that cannot be batched.
    """

    kind: str
    check: Callable[..., None]
    load: Callable[..., Any]
    options: tuple[str, ...] = ()
    shape: Callable[..., tuple[int, ...]] | None = None

    def settings(self, options: Mapping[str, Any] | None) -> dict[str, Any]:
        """The entries of a dataset's ``options`` this operator takes; missing ones keep the operator's defaults."""
        return {name: options[name] for name in self.options if options and name in options}


IMAGE_OPERATOR = FileOperator(kind="image", check=check_image, load=load_image, shape=image_shape)
VIDEO_OPERATOR = FileOperator(kind="video", check=check_video, load=load_video, shape=video_shape,
                              options=("num_frames", "allow_shorter"))

#: Sound: a column of ``audio.AUDIO_COLUMNS`` holds a sound file, or a video read for its sound track.
AUDIO_OPERATOR = FileOperator(kind="audio", check=check_audio, load=load_audio)

# Extension (lower case, with the dot) -> operator.
FILE_OPERATORS: dict[str, FileOperator] = {
    **{extension: IMAGE_OPERATOR for extension in IMAGE_EXTENSIONS},
    **{extension: VIDEO_OPERATOR for extension in VIDEO_EXTENSIONS},
}


def operator_for(path: str | os.PathLike, key: str) -> FileOperator:
    """The operator for ``path``: by its column for a sound column (``AUDIO_COLUMNS``), else by its extension.

    Args:
        path: A data file.
        key: The metadata column that named it, for the error message.

    Raises:
        DatasetError: No operator handles the extension.
    """
    if key in AUDIO_COLUMNS:
        return AUDIO_OPERATOR
    extension = Path(path).suffix.lower()
    operator = FILE_OPERATORS.get(extension)
    if operator is None:
        supported = ", ".join(sorted(FILE_OPERATORS))
        raise DatasetError(
            f"{path} (column {key!r}) has extension {extension or '(none)'!r}, which no file operator loads; "
            f"supported extensions: {supported}. Convert the file or remove {key!r} from data_file_keys"
        )
    return operator
