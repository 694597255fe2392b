"""The trainer's exit codes, in one place, and the entry wrapper that maps how a run ended to them.

======  ==========================================================================================================
Code    Meaning
======  ==========================================================================================================
0       The stage finished.
1       Any other error (a bug, out of memory): read the traceback. A process that lost another process of the run
        (killed, crashed, its machine gone) prints one line naming it instead (:mod:`.machines.watch`).
2       The flags or the input (dataset, stage-1 cache, model files, a checkpoint to resume from, the output folder)
        need fixing; argparse's convention. A checkpoint of another launch (process count, batch size,
        accumulation) or at the end of its run (a resume would train nothing) is refused with it too.
3       Non-finite values stopped the run: training diverged (``--max_nonfinite_steps`` bad steps in a row), or a
        weight file with NaN / inf values was refused. Every file the run wrote holds finite values.
74      The disk ran out of space while writing a file (a checkpoint, a LoRA, a stage-1 cache sample): the message
        names the file, the space it needs and the space free; the files written before it are intact and no
        partial file is left. Free space, then rerun (with ``--resume_from_checkpoint latest`` to continue).
        ``EX_IOERR`` of ``sysexits.h``.
75      Preempted (SIGTERM / SIGINT): the stage saved what a rerun needs and stopped; rerun the same command with
        ``--resume_from_checkpoint latest`` (stage 1: rerun it as it was). ``EX_TEMPFAIL`` of ``sysexits.h``, the
        code retry policies know as "temporary failure"; 143 (128 + SIGTERM) would be indistinguishable from a
        process killed by the signal mid-write.
130     A second Ctrl-C aborted at once, without saving (128 + SIGINT, the shell's convention).
======  ==========================================================================================================

Errors of codes 2, 3 and 74 are the user's to fix, and their messages say what, where and the fix; the entry prints
such a message alone, without a traceback, which would only bury it (a chained download error used to print seven).
``--debug`` or ``DIFFSYNTH_DEBUG=1`` prints the traceback too. Any other error prints its traceback, as an uncaught
one would. Under a launch of several processes, process 0 prints the message and every other failing process its
first line, marked with its rank.

Launchers re-map the codes: ``accelerate launch`` and ``torchrun`` exit with 1 whenever a process fails, printing the
process's own code in their log, and add a traceback of their own (see :mod:`diffsynth.training.launch`, which keeps
it out and exits with the process's code). A scheduler sees the codes above when it runs ``python train.py`` itself.

``main`` keeps raising exceptions (tests and scripts catch them); only :func:`run_with_exit_code` turns them into
codes, at the command-line entry.
"""
from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from ..core.data.errors import CacheError, DataFileNotFoundError, DatasetError
from ..core.disk_full import DiskFullError
from ..core.finite import NonFiniteTensorError
from ..core.loader.errors import ModelConfigError, ModelFilesNotFoundError, ModelLoadError
from .config.errors import FlagError
from .loop.nonfinite_guard import TrainingDivergedError
from .loop.preemption import RunPreempted
from .machines.watch import lost_process_line
from .outputs.checkpoint import CheckpointError

logger = logging.getLogger(__name__)

SUCCESS = 0
FAILED = 1
BAD_INPUT = 2
NON_FINITE = 3
DISK_FULL = 74
PREEMPTED = 75
INTERRUPTED = 130

DEBUG_FLAG = "--debug"
DEBUG_ENV = "DIFFSYNTH_DEBUG"

# ModelLoadError: the files are there but make no model (a truncated shard, a .pth the restricted loader refuses).
_BAD_INPUT_ERRORS = (FlagError, DatasetError, DataFileNotFoundError, CacheError, ModelConfigError,
                     ModelFilesNotFoundError, ModelLoadError, CheckpointError)
_NON_FINITE_ERRORS = (TrainingDivergedError, NonFiniteTensorError)


def exit_code_for(error: BaseException) -> int:
    """The exit code of a run that ended with ``error`` (see the table above)."""
    if isinstance(error, RunPreempted):
        return PREEMPTED
    if isinstance(error, _NON_FINITE_ERRORS):
        return NON_FINITE
    if isinstance(error, DiskFullError):
        return DISK_FULL
    if isinstance(error, _BAD_INPUT_ERRORS):
        return BAD_INPUT
    if isinstance(error, KeyboardInterrupt):
        return INTERRUPTED
    return FAILED


def debug_requested(argv: Sequence[str] | None = None) -> bool:
    """Whether the traceback of a user's error is wanted: ``--debug`` among ``argv`` (None reads ``sys.argv``), or
    ``DIFFSYNTH_DEBUG`` set to anything but empty, ``0``, ``false``, ``no`` or ``off``."""
    words = sys.argv[1:] if argv is None else argv
    return DEBUG_FLAG in words or os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def is_users_to_fix(error: BaseException) -> bool:
    """Whether ``error`` is one the message itself lets the user fix (exit codes 2, 3 and 74)."""
    return isinstance(error, (*_BAD_INPUT_ERRORS, *_NON_FINITE_ERRORS, DiskFullError))


def report_error(error: BaseException, debug: bool = False) -> None:
    """Prints how a run ended on stderr: a user's error as its message alone (unless ``debug``), else a traceback."""
    code = exit_code_for(error)
    if isinstance(error, KeyboardInterrupt) and not debug:
        print("aborted by a second Ctrl-C: nothing was saved since the last checkpoint", file=sys.stderr, flush=True)
        return
    lost = None if debug else lost_process_line(error)
    if lost is not None:  # the communication library's traceback names a socket; this names the process
        print(lost, file=sys.stderr, flush=True)
        return
    if debug or not is_users_to_fix(error):
        traceback.print_exception(error)
        return
    message = str(error).strip() or type(error).__name__
    rank = int(os.environ.get("RANK", "0") or 0)  # set by accelerate launch and torchrun
    if rank:
        print(f"[rank {rank}] error (exit code {code}): {message.splitlines()[0]}", file=sys.stderr, flush=True)
        return
    print(f"error: {message}\n(exit code {code}; for the traceback add {DEBUG_FLAG} or set {DEBUG_ENV}=1)",
          file=sys.stderr, flush=True)


def run_with_exit_code(function: Callable[..., Any], *args: Any, debug: bool = False, **kwargs: Any) -> int:
    """Calls ``function(*args, **kwargs)`` and returns the exit code of how it ended.

    A preemption is reported in one line (it is no error), a user's error as its message (see the module docstring;
    with ``debug`` also its traceback), any other exception with its traceback, as an uncaught one would be.
    ``SystemExit`` (argparse's exit 2 on bad flags) passes through unchanged.
    """
    try:
        function(*args, **kwargs)
    except SystemExit:
        raise
    except BaseException as error:  # noqa: BLE001 - every outcome becomes an exit code here, at the entry point
        if isinstance(error, RunPreempted):
            logger.warning("%s", error)
        else:
            report_error(error, debug)
        return exit_code_for(error)
    return SUCCESS
