"""Draws the distribution of every ``--timestep_sampling`` rule and the loss weightings into one PNG for the docs.

    python scripts/plot_timestep_sampling.py                       # writes docs/images/timestep_sampling.png
    python scripts/plot_timestep_sampling.py --output other.png --draws 50000

Each panel is a histogram of the noise level ``sigma`` (0 clean, 1 pure noise) of ``--draws`` draws made exactly as
training makes them (``TimestepSampling.draw``, one seeded generator per draw), for Qwen-Image's schedule at
1328 x 1328 pixels (6889 latent tokens, which the resolution-dependent shifts read); the last panel plots the loss
weights against ``sigma``. The figure is drawn with Pillow alone, so the script needs nothing beyond the trainer's
dependencies; the same arguments always give the same file.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from PIL import Image, ImageDraw, ImageFont

from diffsynth.core.files import atomic_write
from diffsynth.diffusion.flow_match import FlowMatchScheduler
from diffsynth.pipelines.common import scheduler_from_preset
from diffsynth.training.objective.timestep_sampling import TimestepSampling

REPO = Path(__file__).resolve().parents[1]
LATENTS = (1, 16, 166, 166)  # Qwen-Image at 1328 x 1328
RULES = [
    ("grid (default: the reference)", TimestepSampling()),
    ("grid, weighting logit_normal", TimestepSampling(weighting_scheme="logit_normal")),
    ("grid, weighting mode", TimestepSampling(weighting_scheme="mode")),
    ("uniform", TimestepSampling("uniform")),
    ("sigmoid", TimestepSampling("sigmoid")),
    ("logit_normal", TimestepSampling("logit_normal")),
    ("shift (3.0)", TimestepSampling("shift")),
    ("qwen_shift (1328 x 1328)", TimestepSampling("qwen_shift")),
    ("flux_shift (1328 x 1328)", TimestepSampling("flux_shift")),
]
PANEL, MARGIN, BINS = (300, 200), 34, 50
COLOURS = {"bar": (70, 110, 190), "axis": (40, 40, 40), "reference": (200, 80, 40), "cosmap": (60, 150, 90)}


def sigmas(sampling: TimestepSampling, scheduler: FlowMatchScheduler, draws: int) -> list[float]:
    """The noise levels of ``draws`` draws, each from its own generator as the runner seeds them."""
    return [sampling.draw(scheduler, LATENTS, torch.Generator().manual_seed(index))[0].item()
            / scheduler.num_train_timesteps for index in range(draws)]


def panel(title: str, font: ImageFont.ImageFont) -> tuple[Image.Image, ImageDraw.ImageDraw, tuple[int, int, int, int]]:
    """An empty panel with its title and axes; returns it, its drawer and the plot box ``(left, top, right, bottom)``."""
    image = Image.new("RGB", PANEL, "white")
    draw = ImageDraw.Draw(image)
    box = (MARGIN, 22, PANEL[0] - 10, PANEL[1] - MARGIN)
    draw.text((MARGIN, 4), title, fill=COLOURS["axis"], font=font)
    draw.line([(box[0], box[1]), (box[0], box[3]), (box[2], box[3])], fill=COLOURS["axis"])
    for tick in (0.0, 0.5, 1.0):
        x = box[0] + tick * (box[2] - box[0])
        draw.line([(x, box[3]), (x, box[3] + 4)], fill=COLOURS["axis"])
        draw.text((x - 8, box[3] + 6), f"{tick:g}", fill=COLOURS["axis"], font=font)
    draw.text(((box[0] + box[2]) // 2 - 14, box[3] + 18), "sigma", fill=COLOURS["axis"], font=font)
    return image, draw, box


def histogram(title: str, values: Sequence[float], font: ImageFont.ImageFont) -> Image.Image:
    """A density histogram of ``values`` on [0, 1]."""
    counts = [0] * BINS
    for value in values:
        counts[min(BINS - 1, int(value * BINS))] += 1
    image, draw, (left, top, right, bottom) = panel(title, font)
    tallest = max(counts)
    width = (right - left) / BINS
    for index, count in enumerate(counts):
        height = (bottom - top) * count / tallest
        draw.rectangle([left + index * width, bottom - height, left + (index + 1) * width - 1, bottom],
                       fill=COLOURS["bar"])
    return image


def curves(title: str, named: Sequence[tuple[str, str, Callable[[float], float]]],
           font: ImageFont.ImageFont) -> Image.Image:
    """Each function of ``sigma`` as a line, scaled together, with a legend."""
    image, draw, (left, top, right, bottom) = panel(title, font)
    points = [i / 200 for i in range(1, 200)]
    values = {name: [function(x) for x in points] for name, _, function in named}
    tallest = max(max(v) for v in values.values())
    for row, (name, colour, _) in enumerate(named):
        line = [(left + x * (right - left), bottom - (bottom - top) * y / tallest) for x, y in zip(points, values[name])]
        draw.line(line, fill=COLOURS[colour], width=2)
        draw.text((left + 8, bottom - 18 - 14 * row), name, fill=COLOURS[colour], font=font)
    return image


def figure(draws: int) -> Image.Image:
    """The whole figure: a histogram per rule and the weights, five panels a row."""
    font = ImageFont.load_default()
    scheduler = scheduler_from_preset("qwen_image")
    panels = [histogram(title, sigmas(sampling, scheduler, draws), font) for title, sampling in RULES]
    reference, cosmap = TimestepSampling(), TimestepSampling(weighting_scheme="cosmap")

    def weight(sampling: TimestepSampling) -> Callable[[float], float]:
        return lambda sigma: sampling.weight(scheduler, torch.tensor([sigma * 1000.0])).item()

    panels.append(curves("loss weight", [("reference (grid default)", "reference", weight(reference)),
                                         ("cosmap", "cosmap", weight(cosmap))], font))
    columns = 5
    rows = (len(panels) + columns - 1) // columns
    sheet = Image.new("RGB", (PANEL[0] * columns, PANEL[1] * rows), "white")
    for index, image in enumerate(panels):
        sheet.paste(image, ((index % columns) * PANEL[0], (index // columns) * PANEL[1]))
    return sheet


def main(argv: Sequence[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "images" / "timestep_sampling.png")
    parser.add_argument("--draws", type=int, default=20000, help="draws per rule")
    args = parser.parse_args(argv)
    sheet = figure(args.draws)
    path = atomic_write(args.output, lambda temporary: sheet.save(temporary, format="PNG", optimize=True))
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
