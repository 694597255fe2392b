"""The trainer's command line: every section's argparse group, and the parse into one checked ``RunConfig``.

Flag names and defaults follow the reference DiffSynth-Studio trainer, so its example commands run unchanged (its
flags this trainer does not support are accepted and refused by name: ``reference_flags``). Flags beyond the
reference (seeding, schedulers, clipping, mixed precision, resuming, a step budget) default to doing nothing, so a
reference command trains exactly as it did there. Two safety nets are on by default and change no healthy run's
weights: timed training-state checkpoints (``--checkpoint_every_minutes``) and the stop after consecutive
non-finite steps (``--max_nonfinite_steps``).

Only checks that need nothing but the flags run here (each section's, and ``RunConfig``'s across sections). Whether
model files exist, and whether a LoRA target matches a module, is the loader's and the training module's business:
they know the files and the model (``startup``). The docs' flag tables are rendered from this parser by
``flag_docs``. ``--config FILE`` reads flag values from a YAML or TOML file (``files``); the command line overrides
them.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ..errors import FlagError
from .files import add_config_file_argument, read_config_file
from .reference_flags import add_unsupported_config
from .run_config import SECTIONS, RunConfig


def build_parser(description: str = "Train a LoRA or fine-tune a diffusion model.",
                 video: bool = False) -> argparse.ArgumentParser:
    """Builds the full trainer parser; ``video`` swaps the image size group for the video one (adds --num_frames)
    and turns gradient checkpointing on."""
    parser = argparse.ArgumentParser(description=description)
    add_config_file_argument(parser)
    for section in SECTIONS.values():
        section.add_arguments(parser, video=video)
    add_unsupported_config(parser)
    return parser


def parse_args(argv: Sequence[str] | None = None, video: bool = False,
               parser: argparse.ArgumentParser | None = None) -> RunConfig:
    """Parses and checks the trainer flags (over a ``--config`` file's values, :func:`parse_namespace`); on a problem
    prints usage and every problem, then exits (status 2).

    Args:
        argv: The arguments without the program name; None reads ``sys.argv``.
        video: Build the video parser (adds ``--num_frames``); ignored when ``parser`` is given.
        parser: A parser from :func:`build_parser`.

    Returns:
        The run's config.
    """
    parser = parser or build_parser(video=video)
    try:
        return RunConfig.from_namespace(parse_namespace(parser, argv))
    except FlagError as error:
        parser.error("\n  " + "\n  ".join(error.problems))


def parse_namespace(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses ``argv`` over the values of the ``--config`` file it names, if any: a flag on the command line
    overrides the file's value, and a flag in neither takes its default.

    Args:
        parser: A parser from :func:`build_parser` (its ``--config`` flag).
        argv: The arguments without the program name; None reads ``sys.argv``.

    Raises:
        FlagError: The file's problems (:func:`~diffsynth.training.config.files.read_config_file`).
    """
    namespace = parser.parse_args(argv)
    if namespace.config is None:
        return namespace
    # argparse sets a default only for what the namespace lacks, and the command line's values over it.
    return parser.parse_args(argv, argparse.Namespace(**read_config_file(namespace.config, parser)))
