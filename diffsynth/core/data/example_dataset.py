"""A tiny captioned image dataset drawn from scratch, for tests, smoke runs and the docs' first commands.

Each image is a two-colour gradient with one coloured shape on it, captioned with what is drawn. Sizes lie between 64
and 320 pixels and cycle through landscape, portrait and square, and most sides are not multiples of 16, so the
dataset's resizing, cropping and rounding are all exercised. The same seed gives the same files.

    python -m diffsynth.core.data.example_dataset --output data/example_dataset --num_images 8
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from ..files import atomic_write, atomic_write_text
from .errors import DatasetError

METADATA_FILE = "metadata.csv"
MIN_SIDE, MAX_SIDE = 64, 320
COLOURS = {
    "red": (215, 48, 39), "orange": (244, 140, 30), "yellow": (250, 220, 60), "green": (60, 170, 80),
    "teal": (30, 150, 150), "blue": (40, 90, 200), "purple": (130, 60, 170), "pink": (240, 130, 180),
    "white": (245, 245, 245), "black": (20, 20, 20),
}
SHAPES = ("circle", "square", "triangle", "ring")
PLACES = ("on the left", "in the centre", "on the right")


def _size(rng: random.Random, index: int) -> tuple[int, int]:
    """Landscape, portrait and square in turn, so every orientation appears in even a three-image dataset."""
    long_side = rng.randint(MIN_SIDE + 64, MAX_SIDE)
    short_side = rng.randint(MIN_SIDE, long_side - 32)
    return [(long_side, short_side), (short_side, long_side), (long_side, long_side)][index % 3]


def _gradient(size: tuple[int, int], start: tuple[int, ...], end: tuple[int, ...], vertical: bool) -> Image.Image:
    width, height = size
    ramp = np.linspace(0.0, 1.0, height if vertical else width)
    ramp = ramp[:, None, None] if vertical else ramp[None, :, None]
    pixels = np.broadcast_to((1 - ramp) * np.array(start) + ramp * np.array(end), (height, width, 3))
    return Image.fromarray(pixels.round().astype(np.uint8))


def draw_example(rng: random.Random, index: int) -> tuple[Image.Image, str]:
    """One image and its caption, drawn with ``rng``."""
    size = _size(rng, index)
    start, end, fill = rng.sample(sorted(COLOURS), 3)
    vertical = rng.random() < 0.5
    image = _gradient(size, COLOURS[start], COLOURS[end], vertical)
    shape, place = rng.choice(SHAPES), rng.randrange(len(PLACES))
    radius = min(size[0] // 7, size[1] // 3)  # keeps the shape inside its third of the width
    centre = ((place * 2 + 1) * size[0] // 6, size[1] // 2)
    box = (centre[0] - radius, centre[1] - radius, centre[0] + radius, centre[1] + radius)
    draw = ImageDraw.Draw(image)
    if shape == "circle":
        draw.ellipse(box, fill=COLOURS[fill])
    elif shape == "square":
        draw.rectangle(box, fill=COLOURS[fill])
    elif shape == "triangle":
        draw.polygon([(box[0], box[3]), (box[2], box[3]), (centre[0], box[1])], fill=COLOURS[fill])
    else:
        draw.ellipse(box, outline=COLOURS[fill], width=max(2, radius // 4))
    direction = "top to bottom" if vertical else "left to right"
    article = "an" if start[0] in "aeiou" else "a"
    caption = f"a {fill} {shape} {PLACES[place]} of {article} {start} to {end} gradient running {direction}"
    return image, caption


def build_example_dataset(folder: str | os.PathLike, num_images: int = 4, seed: int = 0) -> Path:
    """Writes ``num_images`` PNG images and ``metadata.csv`` (columns ``image,prompt``) into ``folder``.

    Args:
        folder: The dataset folder (``--dataset_base_path``); created if missing, existing files overwritten.
        num_images: How many images to draw.
        seed: The same seed writes the same images and captions.

    Returns:
        The metadata file (``--dataset_metadata_path``).

    Raises:
        DatasetError: ``num_images`` is below 1.
    """
    if not isinstance(num_images, int) or isinstance(num_images, bool) or num_images < 1:
        raise DatasetError(f"--num_images {num_images!r} must be an integer of at least 1")
    folder = Path(folder)
    rng = random.Random(seed)
    rows = []
    for index in range(num_images):
        image, caption = draw_example(rng, index)
        name = f"image_{index:03d}.png"
        atomic_write(folder / name, lambda temporary, image=image: image.save(temporary, format="PNG"))
        rows.append((name, caption))
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(("image", "prompt"))
    writer.writerows(rows)
    return atomic_write_text(folder / METADATA_FILE, text.getvalue())


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``--output DIR [--num_images N] [--seed S]``; prints the flags that train on the result."""
    parser = argparse.ArgumentParser(description="Write a small procedurally drawn, captioned image dataset.")
    parser.add_argument("--output", required=True, help="folder to write the images and metadata.csv into")
    parser.add_argument("--num_images", type=int, default=4, help="how many images to draw (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="random seed; the same seed writes the same files")
    args = parser.parse_args(argv)
    metadata = build_example_dataset(args.output, num_images=args.num_images, seed=args.seed)
    print(f"wrote {args.num_images} images and {metadata.name} to {metadata.parent}")
    print(f"train on it with: --dataset_base_path {metadata.parent} --dataset_metadata_path {metadata}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
