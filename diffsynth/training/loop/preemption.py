"""Stopping cleanly when asked to: SIGTERM / SIGINT during a stage, and timed checkpoints that bound lost work.

Cluster schedulers (SLURM, Kubernetes, cloud spot instances) send SIGTERM, wait a grace period (often 30 s), then
send SIGKILL; a user presses Ctrl-C (SIGINT). While a stage runs, the first of these signals only sets a request:

- training finishes the optimizer step in progress, writes a training-state checkpoint (atomically, as every
  checkpoint; first, as it is what a resume needs if the grace period runs out), then that step's LoRA file, and
  raises :class:`RunPreempted`, which the command line turns into exit code 75 (``EX_TEMPFAIL``: try again later),
  so a wrapper can tell "stopped and resumable" from a crash. Processes agree on the step through the runner's
  per-step all-reduce, so a signal that reaches only some processes stops all at the same step. A signal that
  arrives while a step's files are being saved stops the run after that save (``TrainingLoop.stop_arrived``, asked
  after each save): one more step would only be saved again, in a grace period that may not leave time for it;
- stage 1 stops after the sample in progress (its files are atomic, so a rerun caches only what is missing), without
  waiting for other processes: their sample counts differ, so a per-sample collective could deadlock.

Ctrl-C pressed again (a second SIGINT) restores the handlers that were there before and hands the signal to the
SIGINT one: ``KeyboardInterrupt`` at once, without saving. A repeated SIGTERM only repeats the request: a process
can receive one SIGTERM twice (from the scheduler, which may signal every process of a job, and from a launcher
such as torchrun forwarding its own), and a scheduler that means to stop at once sends SIGKILL.

Independently, :class:`CheckpointClock` makes a training-state checkpoint due every ``--checkpoint_every_minutes``,
so even a SIGKILL without warning loses at most that much work.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class RunPreempted(Exception):
    """A stage stopped early on SIGTERM / SIGINT after saving what a rerun needs; ``step`` is where it stopped."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


class PreemptionListener:
    """Context manager that turns the first SIGTERM / SIGINT into a stop request (``requested``).

    Signal handlers can only be installed from the main thread; elsewhere (a trainer run from a worker thread) the
    signals keep their usual effect, and a warning says so.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        """Whether a stop signal has arrived."""
        return self.received is not None

    def __enter__(self) -> PreemptionListener:
        if threading.current_thread() is not threading.main_thread():
            logger.warning("not in the main thread: SIGTERM / SIGINT stop this run without saving a checkpoint")
            return self
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._restore()

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.received is None:
            self.received = signum
            logger.warning("received %s: finishing the current step, then saving and exiting (press Ctrl-C again to "
                           "abort at once, without saving)", name)
            return
        if signum != signal.SIGINT:
            logger.warning("received %s again: already stopping after the current step", name)
            return
        previous = self._previous.get(signum, signal.SIG_DFL)
        self._restore()
        if callable(previous):
            previous(signum, frame)  # Python's own SIGINT handler raises KeyboardInterrupt
        elif previous == signal.SIG_DFL:
            signal.raise_signal(signum)  # the default action: the process terminates by the signal


def ignore_stop_signals(worker_id: int) -> None:
    """``worker_init_fn`` for DataLoader workers: they ignore SIGTERM / SIGINT, so that a signal sent to the whole
    process group (Ctrl-C, a scheduler) reaches the training process's handler instead of killing the workers it is
    about to read from. Workers still end with their parent (PyTorch's worker watchdog)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


class CheckpointClock:
    """Says when a timed training-state checkpoint is due (``--checkpoint_every_minutes``; 0 turns it off).

    Args:
        minutes: The interval.
        clock: Seconds from a monotonic source (a parameter for tests).
    """

    def __init__(self, minutes: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not minutes >= 0:
            raise ValueError(f"--checkpoint_every_minutes {minutes} must be at least 0; pass e.g. "
                             "--checkpoint_every_minutes 30, or 0 for no timed checkpoints")
        self.seconds = minutes * 60
        self._clock = clock
        self._since = clock()

    def due(self) -> bool:
        """Whether the interval has passed since the last :meth:`reset` (never, when turned off)."""
        return self.seconds > 0 and self._clock() - self._since >= self.seconds

    def reset(self) -> None:
        """Starts the interval again (call it whenever a checkpoint is written, timed or not)."""
        self._since = self._clock()
