"""Progress that fits where it goes: a tqdm bar on a terminal, one short line every few seconds anywhere else.

A tqdm bar redraws itself with carriage returns. In a log file (``nohup``, a cluster scheduler, CI) every redraw is
kept, so a run's bar becomes one line of tens of thousands of characters that neither ``tail`` nor an editor shows
usefully. :class:`ProgressReport` therefore checks whether its stream (stderr, where tqdm and the log messages go) is
a terminal: if it is, it draws the bar as before; if not, it writes a line such as

    training: 45% 450/1000 steps, epoch 2/5, loss 0.1234, 1.23 s/step, 0.81 samples/s, elapsed 0:09:13,
    ETA 0:11:15, peak 12.3 GiB on cuda:0

(one line, about 150 characters) after the first step, then at the first step that ends ``interval_seconds`` or
more after the previous line, and once more at the end. Lines are written at step ends, so the gap between two of
them is at most ``interval_seconds`` plus one step. The loss and the speed are averages since the previous line,
which steadies the noisy per-step flow-matching loss; the ETA uses the average speed since the report started.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

import torch
from tqdm.auto import tqdm

from ...core.device import peak_memory_bytes
from ..outputs.run_report import format_duration

__all__ = ["ProgressReport", "format_duration"]


@dataclass
class _Window:
    """What happened since the last line: units done, their losses, and when the window started."""

    started: float
    done: int = 0
    loss_sum: float = 0.0
    finite_losses: int = 0
    nonfinite_losses: int = 0

    def add(self, loss: float | None) -> None:
        self.done += 1
        if loss is None:
            return
        if math.isfinite(loss):
            self.loss_sum += loss
            self.finite_losses += 1
        else:
            self.nonfinite_losses += 1


class ProgressReport:
    """Reports a loop's progress: a tqdm bar when the stream is a terminal, else a line every ``interval_seconds``.

    Args:
        total: Units (optimizer steps, samples) the loop will have done at its end, ``initial`` included.
        desc: What the loop does, the start of every line and the bar's label (``"training"``, ``"caching"``).
        interval_seconds: Least time between two lines; 0 writes a line after every unit.
        enabled: Whether to report at all (False on every process but the local main one).
        initial: Units already done before this run (a resumed run's optimizer step).
        unit: The unit's singular name (``"step"``, ``"sample"``).
        num_epochs: The run's epochs, shown with the current epoch; None leaves the epoch out.
        samples_per_unit: Samples one unit consumes (batch size times accumulation times processes), for
            ``samples/s``; None leaves the rate in samples out.
        device: The compute device; its peak memory is shown when it keeps statistics (CUDA).
        stream: Where to write; None is ``sys.stderr``, read when the report starts.
        clock: Seconds from a monotonic clock (tests pass their own).

    Raises:
        ValueError: ``interval_seconds`` is negative or not a number.
    """

    def __init__(self, total: int, desc: str, *, interval_seconds: float, enabled: bool = True, initial: int = 0,
                 unit: str = "step", num_epochs: int | None = None, samples_per_unit: int | None = None,
                 device: torch.device | None = None, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not interval_seconds >= 0:
            raise ValueError(f"--progress_interval_seconds {interval_seconds} must be at least 0; pass e.g. "
                             f"--progress_interval_seconds 30, or 0 for a line per {unit}")
        self.total, self.desc, self.unit = total, desc, unit
        self.enabled, self.interval_seconds = enabled, interval_seconds
        self.num_epochs, self.samples_per_unit, self.device = num_epochs, samples_per_unit, device
        self.stream = stream if stream is not None else sys.stderr
        self._clock = clock
        self.done = initial
        self._done_here = 0
        self._started = clock()
        self._last_update = self._started
        self._window = _Window(started=self._started)
        self._lines_written = 0
        self._epoch: int | None = None
        self._bar = None
        if enabled and _is_terminal(self.stream):
            self._bar = tqdm(total=total, initial=initial, desc=desc, file=self.stream)

    @property
    def draws_a_bar(self) -> bool:
        """Whether progress goes to a tqdm bar (a terminal) rather than to lines."""
        return self._bar is not None

    def update(self, loss: float | None = None, epoch: int | None = None) -> None:
        """Records one unit done, with its loss (None for a loop without one) and 0-based epoch."""
        if not self.enabled:
            return
        now = self._clock()
        self.done += 1
        self._done_here += 1
        self._window.add(loss)
        if self._bar is not None:
            postfix = {} if loss is None else {"loss": f"{loss:.4f}"}
            self._bar.set_postfix(**postfix, **{f"s_per_{self.unit}": f"{now - self._last_update:.2f}"}, refresh=False)
            self._bar.update(1)
        elif self._lines_written == 0 or now - self._window.started >= self.interval_seconds:
            self._write_line(now, epoch)
        self._last_update = now
        self._epoch = epoch

    def close(self) -> None:
        """Ends the report: closes the bar, or writes a last line for the units done since the previous one."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        elif self._window.done:
            self._write_line(self._clock(), self._epoch)

    def _write_line(self, now: float, epoch: int | None) -> None:
        print(self.line(now, epoch), file=self.stream, flush=True)
        self._lines_written += 1
        self._window = _Window(started=now)

    def line(self, now: float, epoch: int | None = None) -> str:
        """The progress line at time ``now``, for the units done since the previous line."""
        window = self._window
        percent = 100 * self.done // self.total if self.total else 100
        parts = [f"{self.desc}: {percent}% {self.done}/{self.total} {self.unit}s"]
        if epoch is not None and self.num_epochs is not None:
            parts.append(f"epoch {epoch + 1}/{self.num_epochs}")
        if window.finite_losses:
            skipped = f" ({window.nonfinite_losses} non-finite left out)" if window.nonfinite_losses else ""
            parts.append(f"loss {window.loss_sum / window.finite_losses:.4f}{skipped}")
        elif window.nonfinite_losses:
            parts.append("loss non-finite")
        if window.done:
            seconds = (now - window.started) / window.done
            parts.append(f"{seconds:.2f} s/{self.unit}")
            if self.samples_per_unit is not None and seconds > 0:
                parts.append(f"{self.samples_per_unit / seconds:.2f} samples/s")
        elapsed = now - self._started
        remaining = max(self.total - self.done, 0)
        eta = elapsed / self._done_here * remaining if self._done_here else math.inf
        parts += [f"elapsed {format_duration(elapsed)}", f"ETA {format_duration(eta)}"]
        peak = None if self.device is None else peak_memory_bytes(self.device)
        if peak is not None:
            parts.append(f"peak {peak / 2**30:.1f} GiB on {self.device}")
        return ", ".join(parts)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a stream without isatty, or a closed one
        return False
