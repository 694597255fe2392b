"""``accelerate launch`` that ends with the training process's message and exit code, not a launcher traceback.

    diffsynth-launch [accelerate launch options] examples/<model>/model_training/train.py [flags]
    diffsynth-launch families [--format text|markdown]
    diffsynth-launch report OUTPUT_PATH [--serve PORT [--host HOST]]
    python -m diffsynth.training.launch [the same]

``diffsynth-launch`` is the console script of :func:`main` (``pyproject.toml``), the command the README gives.

When a training process fails, ``accelerate launch`` fails too and prints a traceback of its own below the process's
message: a ``CalledProcessError`` for one process (and DeepSpeed's multi-node launcher), torch elastic's
``ChildFailedError`` with a table of the failed ranks for several. It then exits with 1, whatever the process's code.
accelerate's ``--quiet`` keeps out the first kind only (and still exits with 1); nothing keeps out the second.

This entry takes exactly ``accelerate launch``'s arguments and runs accelerate's own launcher with them. When a
training process fails, it prints one line naming the script and the process's exit code, and exits with that code
(:mod:`diffsynth.training.exit_codes`: 2 for input to fix, 3 for non-finite values, 74 for a full disk, 75 for a
preempted run that a rerun resumes), so a scheduler can tell them apart. accelerate's notice of the defaults it used
for the options left out is kept out of the console too (``core.library_notices.LIBRARY_NOTICES``). ``--debug`` among
the trainer's flags, or ``DIFFSYNTH_DEBUG=1``, shows the launcher's traceback and that notice as well.

``families`` as the first argument prints the table of the model families instead
(:mod:`diffsynth.pipelines.families_table`) and launches nothing; it imports no torch, so this module imports the
trainer's exit codes (which do) only when launching. ``report OUTPUT_PATH`` prints where a run's report page is and
the run in text, ``--serve PORT`` serves its folder read-only (:mod:`diffsynth.training.report_command`, torch-free too).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Sequence

from ..core.library_notices import quiet_library_notices

FAMILIES = "families"
REPORT = "report"


def failed_process_code(error: BaseException) -> int | None:
    """The exit code of the training process a launcher error reports, or None for any other error.

    A process killed by a signal reports minus the signal's number; it becomes 128 + the number, as a shell says.
    """
    from .exit_codes import FAILED

    code = None
    if isinstance(error, subprocess.CalledProcessError):
        code = error.returncode
    else:
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

        if isinstance(error, ChildFailedError):
            code = error.get_first_failure()[1].exitcode
    if code is None:
        return None
    return 128 - code if code < 0 else code or FAILED


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``accelerate launch`` with ``argv`` (None reads ``sys.argv``); returns the exit code of the run.
    ``families [--format ...]`` prints the families table instead, ``report OUTPUT_PATH`` a run's report."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == [FAMILIES]:
        from ..pipelines.families_table import main as print_families

        return print_families(argv[1:])
    if argv[:1] == [REPORT]:
        from .report_command import main as print_report

        return print_report(argv[1:])
    from accelerate.commands.launch import launch_command, launch_command_parser

    from .exit_codes import SUCCESS, debug_requested

    args = launch_command_parser().parse_args(argv)
    debug = debug_requested(args.training_script_args)
    quiet_library_notices(debug)
    try:
        launch_command(args)
    except Exception as error:  # noqa: BLE001 - only a failed training process is reported here; others re-raise
        code = failed_process_code(error)
        if code is None or debug:
            raise
        reason = f" ({signal.Signals(code - 128).name})" if code > 128 and code - 128 in signal.valid_signals() else ""
        print(f"launch: {args.training_script} exited with code {code}{reason}; its message is above",
              file=sys.stderr, flush=True)
        return code
    return SUCCESS


if __name__ == "__main__":
    sys.exit(main())
