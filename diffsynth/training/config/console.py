"""The console section: progress lines and tracebacks of the errors the user must fix."""

from __future__ import annotations

import argparse
import dataclasses

from .section import Section


@dataclasses.dataclass(frozen=True)
class ConsoleSection(Section):
    """What the run prints."""

    progress_interval_seconds: float = 30.0
    debug: bool = False

    LOWER_BOUNDS = (
        ("progress_interval_seconds", 0, True, "--progress_interval_seconds 30, or 0 for a line every step"),
    )

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, video: bool = False) -> None:
        """Adds the Console group."""
        group = parser.add_argument_group("Console")
        group.add_argument("--progress_interval_seconds", type=float, default=30.0,
                           help="When stderr is not a terminal (a log file, nohup, a scheduler, CI), progress is one "
                                "line (step, epoch, loss, speed, ETA, peak GPU memory) after the first step, then at "
                                "least this many seconds apart, instead of a tqdm bar; 0 writes a line every step.")
        group.add_argument("--debug", action="store_true",
                           help="Also print the traceback of errors the message says how to fix (flags, data, bad "
                                "or missing model files, the output folder, non-finite values, a full disk: exit "
                                "codes 2, 3 and 74), and the "
                                "libraries' notices kept out of the console otherwise (bitsandbytes' optional "
                                "kernels, DeepSpeed's CPU fallback, diffusers' float32 casts, accelerate launch's "
                                "defaults); DIFFSYNTH_DEBUG=1 does the same.")
