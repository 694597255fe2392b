"""A tiny procedurally drawn image-editing dataset, for tests, smoke runs and the Qwen-Image-Edit docs' first commands.

Each sample is an edit: a shape on a gradient recoloured. With one edit image, the edit image shows the shape in its
old colour and the prompt names the new one ("make the circle blue"); with two (the Edit-2509 / 2511 form), the
second edit image is a swatch of the new colour and the prompt refers to the pictures by number ("paint the circle in
picture 1 with the colour of picture 2"). The target image (column ``image``) shows the shape in the new colour.

Both metadata formats are written: ``metadata.csv`` (several edit images in one cell, separated by commas) and
``metadata.json`` (a list). The same seed gives the same files.

    python -m diffsynth.core.data.example_edit_dataset --output data/example_edit_dataset --num_edit_images 2
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import random
from collections.abc import Sequence
from pathlib import Path

from PIL import Image, ImageChops, ImageDraw

from ..files import atomic_write, atomic_write_text
from .errors import DatasetError
from .example_dataset import COLOURS, MAX_SIDE, MIN_SIDE, SHAPES, _draw_shape, _gradient

CSV_METADATA_FILE, JSON_METADATA_FILE = "metadata.csv", "metadata.json"
EDIT_IMAGE_COUNTS = (1, 2)


def draw_edit_example(rng: random.Random, num_edit_images: int) -> tuple[Image.Image, list[Image.Image], str]:
    """One edit drawn with ``rng``: the target image, the edit images and the instruction."""
    width, height = rng.randint(MIN_SIDE, MAX_SIDE), rng.randint(MIN_SIDE, MAX_SIDE)
    start, end, old, new = rng.sample(sorted(COLOURS), 4)
    background = _gradient((width, height), COLOURS[start], COLOURS[end], rng.random() < 0.5)
    shape = rng.choice(SHAPES)
    centre, radius = (width // 2, height // 2), min(width, height) // 3

    def scene(colour: str) -> Image.Image:
        image = background.copy()
        _draw_shape(ImageDraw.Draw(image), shape, centre, radius, COLOURS[colour])
        return image

    edit_images = [scene(old)]
    if num_edit_images == 1:
        prompt = f"make the {shape} {new}"
    else:
        edit_images.append(Image.new("RGB", (width, height), COLOURS[new]))
        prompt = f"paint the {shape} in picture 1 with the colour of picture 2"
    return scene(new), edit_images, prompt


def build_example_edit_dataset(folder: str | os.PathLike, num_samples: int = 4, num_edit_images: int = 1,
                               seed: int = 0, column: str = "edit_image", mask_column: str | None = None) -> Path:
    """Writes ``num_samples`` edits (PNG files) with ``metadata.csv`` and ``metadata.json`` into ``folder``.

    Args:
        folder: The dataset folder (``--dataset_base_path``); created if missing, existing files overwritten.
        num_samples: How many edits to draw.
        num_edit_images: Edit images per sample: 1 (Qwen-Image-Edit) or 2 (Edit-2509 / 2511).
        seed: The same seed writes the same files.
        column: The name of the edit images' column: ``edit_image``, or ``kontext_images`` for FLUX.1 Kontext.
        mask_column: With a name, a column of masks too: white where the target differs from the (first) edit
            image, the recoloured shape (``blockwise_controlnet_inpaint_mask`` for the Qwen-Image Inpaint ControlNet).

    Returns:
        ``metadata.json`` (columns ``image``, ``column``, ``prompt``); ``metadata.csv`` beside it holds the same
        rows.

    Raises:
        DatasetError: A count out of range.
    """
    if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
        raise DatasetError(f"--num_samples {num_samples!r} must be an integer of at least 1")
    if num_edit_images not in EDIT_IMAGE_COUNTS:
        raise DatasetError(f"--num_edit_images {num_edit_images!r} must be one of {EDIT_IMAGE_COUNTS}")
    folder = Path(folder)
    rng = random.Random(seed)
    rows = []
    for index in range(num_samples):
        target, edit_images, prompt = draw_edit_example(rng, num_edit_images)
        names = [f"edit_{index:03d}_{number}.png" for number in range(1, num_edit_images + 1)]
        for name, image in zip([f"target_{index:03d}.png", *names], [target, *edit_images]):
            atomic_write(folder / name, lambda temporary, image=image: image.save(temporary, format="PNG"))
        rows.append({"image": f"target_{index:03d}.png", column: names if num_edit_images > 1 else names[0],
                     "prompt": prompt})
        if mask_column is not None:
            mask = ImageChops.difference(target, edit_images[0]).convert("L").point(lambda v: 255 if v else 0)
            name = rows[-1][mask_column] = f"mask_{index:03d}.png"
            atomic_write(folder / name, lambda temporary: mask.convert("RGB").save(temporary, format="PNG"))
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(("image", column, "prompt", *([mask_column] if mask_column else [])))
    for row in rows:
        edit_image = row[column]
        writer.writerow((row["image"], ",".join(edit_image) if isinstance(edit_image, list) else edit_image,
                         row["prompt"], *([row[mask_column]] if mask_column else [])))
    atomic_write_text(folder / CSV_METADATA_FILE, text.getvalue())
    return atomic_write_text(folder / JSON_METADATA_FILE, json.dumps(rows, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``--output DIR [--num_samples N] [--num_edit_images 1|2] [--seed S] [--column NAME]
    [--mask_column NAME]``; prints the flags."""
    parser = argparse.ArgumentParser(description="Write a small procedurally drawn image-editing dataset.")
    parser.add_argument("--output", required=True, help="folder to write the images and metadata files into")
    parser.add_argument("--num_samples", type=int, default=4, help="how many edits to draw (default 4)")
    parser.add_argument("--num_edit_images", type=int, default=1, choices=EDIT_IMAGE_COUNTS,
                        help="edit images per sample: 1 for Qwen-Image-Edit, 2 for Edit-2509 / 2511 (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="random seed; the same seed writes the same files")
    parser.add_argument("--column", default="edit_image",
                        help="name of the edit images' column (default edit_image; kontext_images for FLUX.1 Kontext)")
    parser.add_argument("--mask_column", default=None,
                        help="also write a column of masks of the recoloured shape under this name (e.g. "
                             "blockwise_controlnet_inpaint_mask)")
    args = parser.parse_args(argv)
    metadata = build_example_edit_dataset(args.output, num_samples=args.num_samples,
                                          num_edit_images=args.num_edit_images, seed=args.seed, column=args.column,
                                          mask_column=args.mask_column)
    columns = ",".join([args.column, *([args.mask_column] if args.mask_column else [])])
    print(f"wrote {args.num_samples} edits, {CSV_METADATA_FILE} and {JSON_METADATA_FILE} to {metadata.parent}")
    print(f"train on it with: --dataset_base_path {metadata.parent} --dataset_metadata_path {metadata} "
          f"--data_file_keys image,{columns} --extra_inputs {columns}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
