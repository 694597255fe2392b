"""Keeps ``<output_path>/logs/report.html`` current while a run trains (the page: ``outputs.run_report``).

When: at the end of the first optimizer step; then at the first step end ``--progress_interval_seconds`` or more after
the previous write (as the progress lines), after every save and every render of samples; and a last time when the
run ends, with status ``finished``, ``failed`` (with the error's one-line message), or ``stopped`` (SIGTERM / SIGINT,
with the message that says how to resume). Writes happen at step ends, so a step longer than the interval delays one.

What: the loss, validation loss and learning rate the logger recorded (``ModelLogger.logged_series``, the values
``logs/metrics.csv`` holds; a resumed run's earlier steps read from that file), the speed and ETA since this process
started training, the peak host memory of this process and the peak device memory, every sample file with its prompt,
and the run's ``config.yaml``. Only the main process writes; a page that cannot be written (a full disk) is warned
about and the run goes on: the page is a view of the run, not part of its results.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import yaml

from ...core.device import peak_memory_bytes
from ..config.files import RUN_CONFIG_FILE
from ..outputs.metrics_log import METRICS_FILE
from ..outputs.run_report import (
    FAILED,
    FINISHED,
    REPORT_FILE,
    RUNNING,
    SERIES,
    STOPPED,
    Series,
    build_run_data,
    list_samples,
    series_from_metrics,
    write_report,
)

logger = logging.getLogger(__name__)


def host_peak_bytes() -> int:
    """The peak resident memory of this process in bytes (0 where the platform does not say)."""
    try:
        import resource
    except ImportError:  # Windows
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB on Linux


class LiveReport:
    """Writes the run's report page at the moments the module docstring lists.

    Args:
        output_path: The run's ``--output_path``.
        total_steps: The optimizer steps the run will have done at its end (a resumed run's included).
        interval_seconds: Least time between two writes while running (``--progress_interval_seconds``).
        series: The logger's ``logged_series``, read at every write.
        enabled: Whether this process writes (the main process only).
        initial_step: The optimizer step a resumed run continues from (0 for a new run).
        device: The compute device, whose peak memory is shown where it keeps statistics (CUDA).
        prompts: The validation prompts, by sample index.
        clock: Seconds from a monotonic clock (tests pass their own).
    """

    def __init__(self, output_path: str | os.PathLike, total_steps: int, interval_seconds: float,
                 series: Mapping[str, Series], *, enabled: bool = True, initial_step: int = 0,
                 device: torch.device | None = None, prompts: Sequence[str] = (),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.output_path, self.total_steps, self.interval_seconds = Path(output_path), total_steps, interval_seconds
        self.series, self.enabled, self.initial_step = series, enabled, initial_step
        self.device, self.prompts, self._clock = device, list(prompts), clock
        self.step = initial_step
        self._started = clock()
        self._last_write: float | None = None
        self._device_peak: int | None = None
        self._config: dict[str, Any] | None = None
        self._earlier: dict[str, Series] = {name: [] for name in SERIES}
        metrics = self.output_path / METRICS_FILE
        if enabled and initial_step and metrics.is_file():  # the steps a resumed run's earlier part logged
            self._earlier = series_from_metrics(metrics.read_text(encoding="utf-8"), initial_step)
        self.path: Path | None = None  # the page, once written

    def update(self, step: int, force: bool = False) -> Path | None:
        """At a step's end: writes the page if it was never written, ``force`` is set (a save, samples), or the
        interval has passed since the last write. Returns the page when written."""
        self.step = step
        now = self._clock()
        if not self.enabled or not (force or self._last_write is None
                                    or now - self._last_write >= self.interval_seconds):
            return None
        return self._write(RUNNING, now)

    def end(self, status: str, message: str | None = None, step: int | None = None) -> Path | None:
        """Writes the page a last time, with ``status`` ``finished``, ``failed`` or ``stopped``, ``message`` and the
        optimizer steps done (``step``; None keeps the last update's)."""
        if status not in (FINISHED, FAILED, STOPPED):
            raise ValueError(f"a run ends finished, failed or stopped, not {status!r}")
        self.step = self.step if step is None else step
        if not self.enabled:
            return None
        return self._write(status, self._clock(), message)

    def run_data(self, status: str, now: float) -> dict[str, Any]:
        """The page's run-data at clock time ``now``."""
        done = self.step - self.initial_step
        speed = (now - self._started) / done if done > 0 else None
        eta = 0.0 if status == FINISHED else (speed * max(self.total_steps - self.step, 0) if speed else None)
        if self.device is not None and (device_peak := peak_memory_bytes(self.device)) is not None:
            self._device_peak = max(self._device_peak or 0, device_peak)
        series = {name: self._earlier[name] + [point for point in self.series.get(name, ())
                                              if point[0] > self.initial_step] for name in SERIES}
        return build_run_data(status=status, step=self.step, total_steps=self.total_steps, series=series,
                              seconds_per_step=speed, eta_seconds=eta, host_bytes=host_peak_bytes(),
                              device_bytes=self._device_peak, samples=list_samples(self.output_path, self.prompts),
                              config=self._run_config())

    def _run_config(self) -> dict[str, Any]:
        """The run's ``config.yaml`` as read back (written before the first step), read once."""
        if self._config is None:
            try:
                loaded = yaml.safe_load((self.output_path / RUN_CONFIG_FILE).read_text(encoding="utf-8"))
            except (OSError, yaml.YAMLError):
                return {}
            self._config = loaded if isinstance(loaded, dict) else {}
        return self._config

    def _write(self, status: str, now: float, message: str | None = None) -> Path | None:
        self._last_write = now
        try:
            self.path = write_report(self.output_path, self.run_data(status, now), message)
        except OSError as error:
            logger.warning("could not write the run report %s (%s); training goes on without it",
                           self.output_path / REPORT_FILE, error)
            return None
        return self.path

