"""A tiny procedurally drawn layer-decomposition dataset, for tests, smoke runs and the Qwen-Image-Layered command.

Each sample is an RGBA picture made of layers: an opaque gradient background, then one transparent layer per shape.
Column ``image`` lists the composite first, then each layer; ``layer_input_image`` is the composite (the image to
decompose) and ``layer_num`` the number of layers, as the reference implementation's Layered dataset holds them. The
metadata is ``metadata.json``; the same seed gives the same files.

    python -m diffsynth.core.data.example_layered_dataset --output data/example_layered_dataset

``--control layer`` (``mask``) writes Qwen-Image-Layered-Control (V2) rows instead: one layer to extract per picture,
``layer_num`` 0 (and the layer's mask as ``context_image``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
from collections.abc import Sequence
from pathlib import Path

from PIL import Image, ImageDraw

from ..files import atomic_write, atomic_write_text
from .errors import DatasetError
from .example_dataset import COLOURS, SHAPES, _draw_shape, _gradient

JSON_METADATA_FILE = "metadata.json"
SIZE = (96, 64)
# Qwen-Image-Layered-Control rows: one layer to extract, or that plus its mask (V2's context_image).
CONTROLS = ("layer", "mask")


def draw_layers(rng: random.Random, num_layers: int) -> tuple[list[Image.Image], str]:
    """The composite then ``num_layers`` RGBA layers (a background, then shapes on transparency), and a caption."""
    names = rng.sample(sorted(COLOURS), 2)
    background = _gradient(SIZE, COLOURS[names[0]], COLOURS[names[1]], rng.random() < 0.5).convert("RGBA")
    layers, described = [background], []
    for _ in range(num_layers - 1):
        layer = Image.new("RGBA", SIZE, (0, 0, 0, 0))
        shape, colour = rng.choice(SHAPES), rng.choice(sorted(COLOURS))
        radius = rng.randint(8, 20)
        centre = (rng.randint(radius, SIZE[0] - radius), rng.randint(radius, SIZE[1] - radius))
        _draw_shape(ImageDraw.Draw(layer), shape, centre, radius, COLOURS[colour])
        layers.append(layer)
        described.append(f"a {colour} {shape}")
    composite = layers[0]
    for layer in layers[1:]:
        composite = Image.alpha_composite(composite, layer)
    return [composite, *layers], "a poster with " + (" and ".join(described) or "a gradient")


def build_example_layered_dataset(folder: str | os.PathLike, num_samples: int = 2, num_layers: int = 2,
                                  seed: int = 0, control: str | None = None) -> Path:
    """Writes ``num_samples`` decompositions (RGBA PNG files) with ``metadata.json`` into ``folder``; returns it.

    ``control`` writes Qwen-Image-Layered-Control rows instead: ``"layer"`` one layer to extract per row (``image``
    a list of that layer, ``layer_num`` 0, the prompt naming the layer's shape), ``"mask"`` the same plus
    ``context_image``, the layer's silhouette, white on black (Layered-Control V2).

    Raises:
        DatasetError: A count below 1 (2 for ``num_layers``: a background and at least one shape), or an unknown
            ``control``.
    """
    if control is not None:
        if control not in CONTROLS:
            raise DatasetError(f"--control {control!r} must be one of {', '.join(CONTROLS)}")
        return _build_control_dataset(Path(folder), num_samples, seed, control == "mask")
    for name, value, least in (("--num_samples", num_samples, 1), ("--num_layers", num_layers, 2)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise DatasetError(f"{name} {value!r} must be an integer of at least {least}")
    folder, rng, rows = Path(folder), random.Random(seed), []
    for index in range(num_samples):
        images, prompt = draw_layers(rng, num_layers)
        names = [f"sample_{index:03d}_{number}.png" for number in range(len(images))]
        for name, image in zip(names, images):
            atomic_write(folder / name, lambda temporary, image=image: image.save(temporary, format="PNG"))
        rows.append({"image": names, "prompt": prompt, "layer_input_image": names[0], "layer_num": num_layers})
    return atomic_write_text(folder / JSON_METADATA_FILE, json.dumps(rows, indent=2) + "\n")


def _build_control_dataset(folder: Path, num_samples: int, seed: int, with_mask: bool) -> Path:
    if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
        raise DatasetError(f"--num_samples {num_samples!r} must be an integer of at least 1")
    rng, rows = random.Random(seed), []
    for index in range(num_samples):
        (composite, _, layer), caption = draw_layers(rng, 2)
        images = {"composite": composite, "layer": layer}
        if with_mask:
            images["mask"] = Image.new("RGB", SIZE)
            images["mask"].paste((255, 255, 255), mask=layer.getchannel("A"))
        for name, image in images.items():
            atomic_write(folder / f"sample_{index:03d}_{name}.png",
                         lambda temporary, image=image: image.save(temporary, format="PNG"))
        row = {"image": [f"sample_{index:03d}_layer.png"], "prompt": caption.removeprefix("a poster with "),
               "layer_input_image": f"sample_{index:03d}_composite.png", "layer_num": 0}
        rows.append({**row, "context_image": f"sample_{index:03d}_mask.png"} if with_mask else row)
    return atomic_write_text(folder / JSON_METADATA_FILE, json.dumps(rows, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``--output DIR [--num_samples N] [--num_layers L] [--seed S]``; prints the flags."""
    parser = argparse.ArgumentParser(description="Write a small procedurally drawn layer-decomposition dataset.")
    parser.add_argument("--output", required=True, help="folder to write the images and metadata.json into")
    parser.add_argument("--num_samples", type=int, default=2, help="how many pictures to draw (default 2)")
    parser.add_argument("--num_layers", type=int, default=2, help="layers per picture, background included (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="random seed; the same seed writes the same files")
    parser.add_argument("--control", choices=CONTROLS, default=None,
                        help="Qwen-Image-Layered-Control rows: one layer to extract (layer), plus its mask as "
                             "context_image (mask, for V2)")
    args = parser.parse_args(argv)
    metadata = build_example_layered_dataset(args.output, args.num_samples, args.num_layers, args.seed, args.control)
    keys = ",context_image" if args.control == "mask" else ""
    print(f"wrote {args.num_samples} pictures and {JSON_METADATA_FILE} to {metadata.parent}")
    print(f"train on it with: --dataset_base_path {metadata.parent} --dataset_metadata_path {metadata} "
          f"--data_file_keys image,layer_input_image{keys} --extra_inputs layer_num,layer_input_image{keys}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
