"""The trainer's exit codes, in one place, and the entry wrapper that maps how a run ended to them.

======  ==========================================================================================================
Code    Meaning
======  ==========================================================================================================
0       The stage finished.
1       Any other error (a bug, out of memory, a lost process): read the traceback.
2       The flags or the input (dataset, stage-1 cache, model files) need fixing; argparse's convention.
3       Non-finite values stopped the run: training diverged (``--max_nonfinite_steps`` bad steps in a row), or a
        weight file with NaN / inf values was refused. Every file the run wrote holds finite values.
75      Preempted (SIGTERM / SIGINT): the stage saved what a rerun needs and stopped; rerun the same command with
        ``--resume_from_checkpoint latest`` (stage 1: rerun it as it was). ``EX_TEMPFAIL`` of ``sysexits.h``, the
        code retry policies know as "temporary failure"; 143 (128 + SIGTERM) would be indistinguishable from a
        process killed by the signal mid-write.
130     A second Ctrl-C aborted at once, without saving (128 + SIGINT, the shell's convention).
======  ==========================================================================================================

Launchers re-map them: ``accelerate launch`` and ``torchrun`` exit with 1 whenever a process fails, printing the
process's own code in their log. A scheduler sees the codes above when it runs ``python train.py`` itself.

``main`` keeps raising exceptions (tests and scripts catch them); only :func:`run_with_exit_code` turns them into
codes, at the command-line entry.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from typing import Any

from ..core.data.errors import CacheError, DataFileNotFoundError, DatasetError
from ..core.finite import NonFiniteTensorError
from ..core.loader.errors import ModelConfigError, ModelFilesNotFoundError
from .nonfinite_guard import TrainingDivergedError
from .parsers import FlagError
from .preemption import RunPreempted

logger = logging.getLogger(__name__)

SUCCESS = 0
FAILED = 1
BAD_INPUT = 2
NON_FINITE = 3
PREEMPTED = 75
INTERRUPTED = 130

_BAD_INPUT_ERRORS = (FlagError, DatasetError, DataFileNotFoundError, CacheError, ModelConfigError,
                     ModelFilesNotFoundError)


def exit_code_for(error: BaseException) -> int:
    """The exit code of a run that ended with ``error`` (see the table above)."""
    if isinstance(error, RunPreempted):
        return PREEMPTED
    if isinstance(error, (TrainingDivergedError, NonFiniteTensorError)):
        return NON_FINITE
    if isinstance(error, _BAD_INPUT_ERRORS):
        return BAD_INPUT
    if isinstance(error, KeyboardInterrupt):
        return INTERRUPTED
    return FAILED


def run_with_exit_code(function: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """Calls ``function(*args, **kwargs)`` and returns the exit code of how it ended.

    A preemption is reported in one line (it is no error); any other exception with its traceback, as an uncaught
    one would be. ``SystemExit`` (argparse's exit 2 on bad flags) passes through unchanged.
    """
    try:
        function(*args, **kwargs)
    except SystemExit:
        raise
    except BaseException as error:  # noqa: BLE001 - every outcome becomes an exit code here, at the entry point
        if isinstance(error, RunPreempted):
            logger.warning("%s", error)
        else:
            traceback.print_exc()
        return exit_code_for(error)
    return SUCCESS
