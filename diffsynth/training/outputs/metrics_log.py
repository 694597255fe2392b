"""The per-step records of :class:`~diffsynth.training.outputs.logger.ModelLogger`: ``logs/metrics.csv`` (rows after a
resumed step dropped), TensorBoard and wandb, and the images rendered while training (``samples/step-N/``).

A mixin, so that the logger keeps one object per run; it reads the logger's attributes set in its ``__init__``.
"""

from __future__ import annotations

import csv
import functools
import importlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...core.device import warn_once
from ...core.files import atomic_write_text
from ...core.written_files import record_written

logger = logging.getLogger(__name__)

METRICS_FILE = Path("logs") / "metrics.csv"


class MetricsLogging:
    """Metrics and samples of a run (mixed into ``ModelLogger``)."""

    @functools.cached_property
    def logged_series(self) -> dict[str, list[list[float]]]:
        """Metric name -> ``[[step, value], ...]`` of every metric this process logged (main process), in order: what
        the run report charts (``logs/report.html``), with or without ``--enable_csv_log``."""
        return {}

    def _open_csv(self, path: Path, resume_step: int | None, content: bytes | None = None) -> None:
        """Opens the CSV to append to; ``content``: the file as a resume read it at the start (only this run writes
        it since)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        if content is None and path.exists():
            content = path.read_bytes()
        if content is not None:
            complete = content.rfind(b"\n") + 1
            if complete < len(content):  # a run killed mid-row left half a line; it must not glue onto the next
                os.truncate(path, complete)
            if complete:
                self._csv_header = next(csv.reader([content[:content.find(b"\n")].decode("utf-8")]))
                if resume_step is not None:
                    self._drop_rows_after(path, content[:complete].decode("utf-8"), resume_step)
        self._csv_file = open(path, "a", newline="", encoding="utf-8")
        self._csv_writer = csv.writer(self._csv_file, lineterminator="\n")

    def _drop_rows_after(self, path: Path, text: str, step: int) -> None:
        """Rewrites the CSV without the rows of steps after ``step`` (a row whose step is not a number is kept)."""
        if "step" not in self._csv_header:
            return
        column = self._csv_header.index("step")
        lines = text.splitlines(keepends=True)

        def later(line: str) -> bool:
            row = next(csv.reader([line]), [])
            return len(row) > column and row[column].isdigit() and int(row[column]) > step

        kept = [lines[0], *(line for line in lines[1:] if not later(line))]
        if len(kept) < len(lines):
            logger.info("%s: dropping %d rows logged after step %d, which the resumed run logs again", path,
                        len(lines) - len(kept), step)
            atomic_write_text(path, "".join(kept))

    def log_metrics(self, step: int, metrics: Mapping[str, float | torch.Tensor | None]) -> None:
        """Records ``metrics`` at ``step`` in every enabled sink; the CSV row reaches the OS before this returns.

        The CSV columns are fixed by its first row (or, when appending to an earlier run's file, by that file's
        header); metrics missing from a row leave the cell empty, new ones are left out of the CSV with a warning. A
        metric given as None (one measured on some steps only, such as ``val_loss``) is a column from the first row
        with an empty cell, and is not sent to TensorBoard or wandb.
        """
        if not self.is_main_process:
            return
        values = {key: float(value) for key, value in metrics.items() if value is not None}
        for key, value in values.items():
            self.logged_series.setdefault(key, []).append([step, value])
        if self._csv_pending is not None:
            self._open_csv(*self._csv_pending)
            self._csv_pending = None
        if self._csv_writer is not None:
            if self._csv_header is None:
                self._csv_header = ["step", *metrics]
                self._csv_writer.writerow(self._csv_header)
            extra = sorted(set(values) - set(self._csv_header))
            if extra:
                warn_once(f"metrics-csv-{extra}", f"metrics {extra} are not columns of {METRICS_FILE} (columns "
                                                  f"{self._csv_header}); they are left out of the CSV")
            self._csv_writer.writerow([step if column == "step" else values.get(column, "")
                                       for column in self._csv_header])
            self._csv_file.flush()
            if not self._csv_recorded:  # once: appended rows keep it the file that was recorded
                record_written(self.output_path / METRICS_FILE, grows=True)
                self._csv_recorded = True
        if self._tensorboard is not None:
            for key, value in values.items():
                self._tensorboard.add_scalar(key, value, step)
            self._tensorboard.flush()
        if self._wandb_run is not None:
            self._wandb_run.log(values, step=step)

    def log_sample(self, step: int, index: int, output: Any, fps: int = 16) -> None:
        """Logs sample ``index`` rendered at ``step`` (a PIL image, a list of frames, or frames and their sound) to
        TensorBoard and wandb.

        TensorBoard stores a video through moviepy; without it, the first frame is logged as an image instead.
        """
        if not self.is_main_process or (self._tensorboard is None and self._wandb_run is None):
            return
        if isinstance(output, tuple):  # (frames, waveform) of an audio+video model: the frames
            output = output[0]
        frames = list(output) if isinstance(output, list) else [output]
        arrays = np.stack([np.asarray(frame.convert("RGB")) for frame in frames])  # (frames, H, W, 3) uint8
        tag = f"samples/{index:02d}"
        if self._tensorboard is not None:
            if len(frames) == 1:
                self._tensorboard.add_image(tag, arrays[0], step, dataformats="HWC")
            elif importlib.util.find_spec("moviepy") is not None:
                self._tensorboard.add_video(tag, arrays.transpose(0, 3, 1, 2)[None], step, fps=fps)
            else:
                warn_once("tensorboard-video", "TensorBoard stores videos through moviepy, which is missing; the "
                                               "first frame of each video sample is logged instead")
                self._tensorboard.add_image(tag, arrays[0], step, dataformats="HWC")
            self._tensorboard.flush()
        if self._wandb_run is not None:
            wandb = importlib.import_module("wandb")
            media = (wandb.Image(arrays[0]) if len(frames) == 1
                     else wandb.Video(arrays.transpose(0, 3, 1, 2), fps=fps, format="mp4"))
            self._wandb_run.log({tag: media}, step=step)
