"""``cli``: the command-line entry of every ``examples/<model>/model_training/train.py``.

A ``train.py`` names its pipeline as ``"module:Class"``, so that this module, importing no torch, checks the flags
first: a misspelled flag or a bad value is answered in a fraction of a second, not after the seconds that torch,
diffusers and the pipeline take to import. The checks that need more (across sections, against the pipeline and the
files) run in :func:`diffsynth.training.entry.main`.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from ..core.unused_libraries import keep_out
from .config.parsers import read_flags

if TYPE_CHECKING:
    from ..diffusion.base_pipeline import BasePipeline


def cli(pipeline: type[BasePipeline] | str, argv: Sequence[str] | None = None, video: bool = False) -> NoReturn:
    """Runs :func:`~diffsynth.training.entry.main` and exits with the code of how it ended.

    See :mod:`diffsynth.training.exit_codes`: 0 done, 1 error, 2 bad flags or input, 3 non-finite values (diverged),
    74 disk full, 75 preempted (resumable), 130 aborted by a second Ctrl-C. Errors of codes 2, 3 and 74 print their
    message without a traceback unless ``--debug`` or ``DIFFSYNTH_DEBUG=1`` asks for it.

    Args:
        pipeline: The pipeline class, or where it is as ``"package.module:Class"`` (imported after the flags parse).
        argv: The arguments without the program name; None reads ``sys.argv``.
        video: Train on videos (the parser adds ``--num_frames``).
    """
    flags = read_flags(argv, video=video)  # exits with 2 on a flag error, before torch is imported; parsed once
    # This process's own command line, training a pipeline of this package: its flags are all it will do (a user's
    # pipeline module may import bitsandbytes for itself).
    ours = isinstance(pipeline, str) and pipeline.startswith("diffsynth.")
    if argv is None and ours and not flags.uses_bitsandbytes():
        keep_out("bitsandbytes")
    from .entry import main
    from .exit_codes import debug_requested, run_with_exit_code
    from .startup.accelerator import exit_process

    if isinstance(pipeline, str):
        module_name, _, class_name = pipeline.partition(":")
        pipeline = getattr(importlib.import_module(module_name), class_name)
    exit_process(run_with_exit_code(main, pipeline, argv, video=video, debug=debug_requested(argv), flags=flags))
