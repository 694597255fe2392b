"""``logs/loss.png``: the loss of every optimizer step, its moving average and the learning rate, in one picture.

The logger redraws it after each save, so a run's curve is there to look at without TensorBoard or wandb.

It is drawn with Pillow, which the package already needs for images, rather than with a plotting library:
matplotlib and what it pulls in (fonttools, contourpy, kiwisolver, pyparsing, cycler, python-dateutil) would add tens
of megabytes to every install, or, as an optional extra, leave the chart missing exactly when a newcomer looks for
it, for what is three lines, two axes and their labels. Pillow's default font is the scalable Aileron where Pillow
has FreeType (its wheels do) and a small bitmap font otherwise.

Reading the curve: the flow-matching loss depends mostly on the timestep drawn for each sample, so the per-step
values scatter widely; the moving average is what falls as a LoRA learns. Steps whose loss was NaN or inf (skipped
by the non-finite guard) are marked in red along the bottom.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from ...core.files import atomic_write

LOSS_CHART_FILE = Path("logs") / "loss.png"
CHART_SIZE = (960, 540)  # width, height in pixels
_MARGIN = {"left": 80, "right": 90, "top": 48, "bottom": 56}
_COLOURS = {"loss": (160, 190, 230), "average": (20, 70, 160), "lr": (230, 120, 20), "nonfinite": (210, 30, 30),
            "axis": (60, 60, 60), "grid": (228, 228, 228), "text": (30, 30, 30)}
_MAX_AVERAGE_WINDOW = 100


@dataclass
class LossHistory:
    """The run's loss and learning rate per optimizer step, in step order."""

    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    learning_rates: list[float] = field(default_factory=list)

    def add(self, step: int, loss: float, learning_rate: float) -> None:
        """Records one optimizer step."""
        self.steps.append(step)
        self.losses.append(loss)
        self.learning_rates.append(learning_rate)

    @classmethod
    def from_metrics_csv(cls, path: str | os.PathLike, up_to_step: int) -> LossHistory:
        """The steps up to ``up_to_step`` that a ``logs/metrics.csv`` holds (a resumed run's earlier part).

        Rows without a number in the ``step``, ``loss`` or ``lr`` column are left out; a missing file gives an empty
        history.
        """
        try:
            with open(path, newline="", encoding="utf-8") as handle:
                return cls.from_metrics_text(handle.read(), up_to_step)
        except FileNotFoundError:
            return cls()

    @classmethod
    def from_metrics_text(cls, text: str, up_to_step: int) -> LossHistory:
        """``from_metrics_csv`` of a ``logs/metrics.csv`` already read."""
        history = cls()
        for row in csv.DictReader(io.StringIO(text, newline="")):
            try:
                step, loss, learning_rate = int(row["step"]), float(row["loss"]), float(row["lr"])
            except (KeyError, TypeError, ValueError):
                continue
            if step <= up_to_step:
                history.add(step, loss, learning_rate)
        return history


def average_window(num_steps: int) -> int:
    """Steps in the moving average: a tenth of the run, at least 1 and at most 100."""
    return max(1, min(_MAX_AVERAGE_WINDOW, num_steps // 10))


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """The mean of the finite values among each value and the ``window - 1`` before it (NaN where there are none)."""
    averages, total, count = [], 0.0, 0
    for index, value in enumerate(values):
        if math.isfinite(value):
            total, count = total + value, count + 1
        if index >= window and math.isfinite(values[index - window]):
            total, count = total - values[index - window], count - 1
        averages.append(total / count if count else math.nan)
    return averages


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round values (1, 2 or 5 times a power of ten apart) spanning ``[low, high]``."""
    if not high > low:
        return [low]
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(multiple * power for multiple in (1, 2, 5, 10) if multiple * power >= raw)
    first = math.ceil(low / step - 1e-9) * step  # the tolerance keeps a bound that is a tick
    return [first + index * step for index in range(int((high - first) / step + 1e-9) + 1)]


def _padded_range(values: Sequence[float], from_zero: bool = False) -> tuple[float, float]:
    """The axis range: the finite values with 5% to spare, from 0 when ``from_zero`` (a learning rate)."""
    finite = [value for value in values if math.isfinite(value)]
    if not finite:
        return 0.0, 1.0
    low, high = (min(0.0, *finite) if from_zero else min(finite)), max(finite)
    pad = (high - low) * 0.05 or abs(high) * 0.1 or 1.0
    return (low if from_zero else low - pad), high + pad


def _label(value: float) -> str:
    """A tick label: ``0.25``, or ``2.5e-5`` for the small values of a learning rate."""
    if value == 0 or abs(value) >= 1e-2:
        return f"{value:.6g}"
    mantissa, exponent = f"{value:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def draw_loss_chart(history: LossHistory, path: str | os.PathLike, title: str = "training loss") -> Path:
    """Draws the history as a PNG of :data:`CHART_SIZE` and writes it to ``path`` atomically.

    Args:
        history: At least one step.
        path: The file to write, e.g. ``<output_path>/logs/loss.png``.
        title: The line above the chart.

    Returns:
        ``path`` as a ``Path``.

    Raises:
        ValueError: The history is empty.
    """
    if not history.steps:
        raise ValueError("a loss chart needs at least one step")
    width, height = CHART_SIZE
    image = Image.new("RGB", CHART_SIZE, "white")
    draw = ImageDraw.Draw(image)
    font, small = ImageFont.load_default(size=16), ImageFont.load_default(size=13)
    left, top = _MARGIN["left"], _MARGIN["top"]
    right, bottom = width - _MARGIN["right"], height - _MARGIN["bottom"]
    first, last = history.steps[0], history.steps[-1]
    span = (first - 0.5, last + 0.5) if first == last else (first, last)
    loss_range = _padded_range(history.losses)
    lr_range = _padded_range(history.learning_rates, from_zero=True)

    def x_of(step: float) -> float:
        return left + (step - span[0]) / (span[1] - span[0]) * (right - left)

    def y_of(value: float, value_range: tuple[float, float]) -> float:
        return bottom - (value - value_range[0]) / (value_range[1] - value_range[0]) * (bottom - top)

    # Grid and axes, with the loss on the left and the learning rate on the right.
    for tick in nice_ticks(*loss_range):
        y = y_of(tick, loss_range)
        draw.line([(left, y), (right, y)], fill=_COLOURS["grid"])
        draw.text((left - 6, y), _label(tick), fill=_COLOURS["text"], font=small, anchor="rm")
    for tick in nice_ticks(*lr_range, count=4):
        draw.text((right + 6, y_of(tick, lr_range)), _label(tick), fill=_COLOURS["lr"], font=small, anchor="lm")
    for tick in nice_ticks(*span, count=6):
        if tick == int(tick):
            draw.text((x_of(tick), bottom + 6), f"{int(tick)}", fill=_COLOURS["text"], font=small, anchor="mt")
    draw.rectangle([left, top, right, bottom], outline=_COLOURS["axis"])
    draw.text(((left + right) / 2, height - 8), "optimizer step", fill=_COLOURS["text"], font=font, anchor="mb")
    draw.text((8, top - 10), "loss", fill=_COLOURS["text"], font=font, anchor="ls")
    draw.text((width - 8, top - 10), "learning rate", fill=_COLOURS["lr"], font=font, anchor="rs")
    draw.text((width / 2, 8), title, fill=_COLOURS["text"], font=font, anchor="mt")

    # The curves: raw loss, its moving average, the learning rate; red marks for non-finite steps.
    window = average_window(len(history.steps))
    series = [(history.losses, loss_range, _COLOURS["loss"], 1),
              (moving_average(history.losses, window), loss_range, _COLOURS["average"], 2),
              (history.learning_rates, lr_range, _COLOURS["lr"], 1)]
    for values, value_range, colour, line_width in series:
        for run in _finite_runs(history.steps, values):
            points = [(x_of(step), y_of(value, value_range)) for step, value in run]
            if len(points) == 1:
                x, y = points[0]
                draw.ellipse([x - 2, y - 2, x + 2, y + 2], fill=colour)
            else:
                draw.line(points, fill=colour, width=line_width)
    nonfinite = [step for step, loss in zip(history.steps, history.losses) if not math.isfinite(loss)]
    for step in nonfinite:
        draw.line([(x_of(step), bottom - 8), (x_of(step), bottom)], fill=_COLOURS["nonfinite"], width=2)

    legend = [(_COLOURS["loss"], "loss per step"),
              (_COLOURS["average"], f"moving average over {window} step{'s' if window > 1 else ''}"),
              (_COLOURS["lr"], "learning rate (right axis)")]
    if nonfinite:
        legend.append((_COLOURS["nonfinite"], f"{len(nonfinite)} non-finite steps (skipped)"))
    longest = max(draw.textlength(text, font=small) for _, text in legend)
    draw.rectangle([left + 4, top + 4, left + 48 + longest, top + 24 + 18 * (len(legend) - 1)], fill="white",
                   outline=_COLOURS["grid"])
    for row, (colour, text) in enumerate(legend):
        y = top + 14 + row * 18
        draw.line([(left + 10, y), (left + 34, y)], fill=colour, width=3)
        draw.text((left + 40, y), text, fill=_COLOURS["text"], font=small, anchor="lm")
    return atomic_write(path, lambda temporary: image.save(temporary, format="PNG"))


def _finite_runs(steps: Sequence[int], values: Sequence[float]) -> list[list[tuple[int, float]]]:
    """The stretches of consecutive finite values, so a line never crosses a gap left by NaN or inf."""
    runs: list[list[tuple[int, float]]] = [[]]
    for step, value in zip(steps, values):
        if math.isfinite(value):
            runs[-1].append((step, value))
        elif runs[-1]:
            runs.append([])
    return [run for run in runs if run]
