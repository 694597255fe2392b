"""A picture of what a LoRA changes: one render without it and one with it (same prompt, same seed), side by side,
with their difference amplified to full brightness, labelled, and an optional caption below.

The two renders share everything but the LoRA, so every pixel of the difference panel is the LoRA's doing; a black
difference panel means the LoRA changed nothing (a file that matched no layer, or a strength of 0).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from ..core.files import atomic_write

GAP = 12  # pixels between and around the panels
_LABEL_HEIGHT = 28
_FONT_SIZE, _CAPTION_FONT_SIZE = 16, 15


@dataclass(frozen=True)
class Difference:
    """How far two renders are apart, per colour channel in 0-255 units."""

    mean: float
    max: int

    def describe(self) -> str:
        """One line such as ``mean |difference| 12.3, max 187 (of 255)``."""
        return f"mean |difference| {self.mean:.1f}, max {self.max} (of 255)"


def difference(before: Image.Image, after: Image.Image) -> tuple[Image.Image, Difference]:
    """The per-pixel absolute difference of two RGB images of one size, scaled so its largest value is white.

    Raises:
        ValueError: The images differ in size.
    """
    if before.size != after.size:
        raise ValueError(f"the renders differ in size ({before.size} and {after.size}); render both alike")
    delta = np.abs(np.asarray(before.convert("RGB"), dtype=np.int16) - np.asarray(after.convert("RGB"), dtype=np.int16))
    peak = int(delta.max())
    scaled = delta * (255.0 / peak) if peak else delta
    return Image.fromarray(scaled.astype(np.uint8)), Difference(mean=float(delta.mean()), max=peak)


def _wrap(draw: ImageDraw.ImageDraw, text: str, font: ImageFont.ImageFont, width: float) -> list[str]:
    lines = []
    for paragraph in text.split("\n"):
        line = ""
        for word in paragraph.split():
            candidate = f"{line} {word}".strip()
            if line and draw.textlength(candidate, font=font) > width:
                lines.append(line)
                candidate = word
            line = candidate
        lines.append(line)
    return lines


def before_after_image(before: Image.Image, after: Image.Image, caption: str = "") -> tuple[Image.Image, Difference]:
    """Composes ``before | after | difference`` with a label above each panel and ``caption`` (wrapped) below.

    Returns:
        The picture, and the difference between the two renders.
    """
    diff, stats = difference(before, after)
    width, height = before.size
    canvas_width = 3 * width + 4 * GAP
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    font, caption_font = ImageFont.load_default(size=_FONT_SIZE), ImageFont.load_default(size=_CAPTION_FONT_SIZE)
    caption_lines = _wrap(probe, f"{stats.describe()}\n{caption}".strip(), caption_font, canvas_width - 2 * GAP)
    line_height = _CAPTION_FONT_SIZE + 6
    canvas = Image.new("RGB", (canvas_width, _LABEL_HEIGHT + height + 2 * GAP + line_height * len(caption_lines)),
                       "white")
    draw = ImageDraw.Draw(canvas)
    scale = f" (x{255 / stats.max:.1f})" if stats.max else " (none)"
    panels = [(before, "without the LoRA"), (after, "with the LoRA"), (diff, f"difference{scale}")]
    for index, (panel, label) in enumerate(panels):
        left = GAP + index * (width + GAP)
        draw.text((left + width / 2, _LABEL_HEIGHT / 2 + 2), label, fill="black", font=font, anchor="mm")
        canvas.paste(panel.convert("RGB"), (left, _LABEL_HEIGHT))
    top = _LABEL_HEIGHT + height + GAP
    for row, line in enumerate(caption_lines):
        draw.text((GAP, top + row * line_height), line, fill="black", font=caption_font)
    return canvas, stats


def panel_boxes(image_size: tuple[int, int]) -> list[tuple[int, int, int, int]]:
    """Where :func:`before_after_image` put the three panels of renders of ``image_size``: ``(left, top, right,
    bottom)`` boxes for ``Image.crop``, in the order before, after, difference."""
    width, height = image_size
    return [(GAP + index * (width + GAP), _LABEL_HEIGHT, GAP + index * (width + GAP) + width, _LABEL_HEIGHT + height)
            for index in range(3)]


def save_before_after(before: Image.Image, after: Image.Image, path: str | os.PathLike,
                      caption: str = "") -> tuple[Path, Difference]:
    """Writes :func:`before_after_image` to ``path`` atomically (the suffix picks the format); returns the path and the
    difference."""
    picture, stats = before_after_image(before, after, caption)
    image_format = Image.registered_extensions().get(Path(path).suffix.lower(), "PNG")
    return atomic_write(path, lambda temporary: picture.save(temporary, format=image_format)), stats
