"""A tiny procedurally drawn entity-mask dataset, for the tests of the EliGen commands.

Each sample is a gradient with two shapes; column ``eligen_entity_prompts`` names each shape and
``eligen_entity_masks`` lists one mask per shape (white where it is, black elsewhere), as the reference
implementation's EliGen dataset holds them. The metadata is ``metadata.json``; the same seed gives the same files.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from PIL import Image, ImageDraw

from ..files import atomic_write, atomic_write_text
from .example_dataset import COLOURS, SHAPES, _check_count, _draw_shape, _gradient

JSON_METADATA_FILE = "metadata.json"
SIZE = (96, 64)
ENTITIES = 2


def draw_entities(rng: random.Random) -> tuple[Image.Image, list[Image.Image], list[str], str]:
    """An image with ``ENTITIES`` shapes, each shape's mask and prompt, and a caption of the whole."""
    names = rng.sample(sorted(COLOURS), 2)
    image = _gradient(SIZE, COLOURS[names[0]], COLOURS[names[1]], rng.random() < 0.5)
    masks, prompts = [], []
    for number in range(ENTITIES):
        shape, colour, radius = rng.choice(SHAPES), rng.choice(sorted(COLOURS)), rng.randint(10, 18)
        # One shape per half of the image, so the masks do not overlap.
        low, high = number * SIZE[0] // ENTITIES + radius, (number + 1) * SIZE[0] // ENTITIES - radius
        centre = (rng.randint(low, high), rng.randint(radius, SIZE[1] - radius))
        _draw_shape(ImageDraw.Draw(image), shape, centre, radius, COLOURS[colour])
        mask = Image.new("RGB", SIZE)
        _draw_shape(ImageDraw.Draw(mask), "square", centre, radius, (255, 255, 255))
        masks.append(mask)
        prompts.append(f"a {colour} {shape}")
    return image, masks, prompts, f"{' and '.join(prompts)} on a gradient"


def build_example_eligen_dataset(folder: str | os.PathLike, num_samples: int = 2, seed: int = 0) -> Path:
    """Writes ``num_samples`` images, their entity masks (PNG) and ``metadata.json`` into ``folder``; returns it.

    Raises:
        DatasetError: ``num_samples`` below 1.
    """
    _check_count("--num_samples", num_samples)
    folder, rng, rows = Path(folder), random.Random(seed), []
    for index in range(num_samples):
        image, masks, prompts, caption = draw_entities(rng)
        names = [f"sample_{index:03d}.png", *(f"sample_{index:03d}_mask_{n}.png" for n in range(len(masks)))]
        for name, picture in zip(names, [image, *masks]):
            atomic_write(folder / name, lambda temporary, picture=picture: picture.save(temporary, format="PNG"))
        rows.append({"image": names[0], "prompt": caption, "eligen_entity_prompts": prompts,
                     "eligen_entity_masks": names[1:]})
    return atomic_write_text(folder / JSON_METADATA_FILE, json.dumps(rows, indent=2) + "\n")

