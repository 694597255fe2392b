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

A flag error prints each problem on a line, the closest flag names for an unknown flag, and a pointer to ``--help``
instead of argparse's usage, which for the trainer is some 95 lines above the line that matters (``FlagParser``).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from .errors import FlagError
from .files import add_config_file_argument, read_config_file
from .reference_flags import add_unsupported_config
from .sections import SECTIONS

if TYPE_CHECKING:
    from .run_config import RunConfig

HELP_HINT = "run with --help for all flags"


class FlagParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are short: one line per problem, then :data:`HELP_HINT`; exit status 2.

    An unknown flag is named with the value given after it and the closest flag names, so that a typo such as
    ``--lora_rnak 4`` reads ``did you mean --lora_rank?``.
    """

    def parse_args(self, args: Sequence[str] | None = None,
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        """As ``ArgumentParser.parse_args``, with a problem per unknown flag instead of "unrecognized arguments"."""
        namespace, unknown = self.parse_known_args(args, namespace)
        if unknown:
            self.error("\n".join(self.unknown_flag_problems(unknown)))
        return namespace

    def error(self, message: str) -> NoReturn:
        """Prints each line of ``message`` as an error of this command, then :data:`HELP_HINT`, and exits with 2."""
        lines = [line.strip() for line in message.splitlines() if line.strip()]
        self.exit(2, "".join(f"{self.prog}: error: {line}\n" for line in lines) + f"{self.prog}: {HELP_HINT}\n")

    def unknown_flag_problems(self, words: Sequence[str]) -> list[str]:
        """One problem per unknown flag among ``words`` (what ``parse_known_args`` left over), with the values that
        follow it, and one for values that follow no flag.

        Args:
            words: The words no flag took, in command-line order.

        Returns:
            Messages such as ``--lora_rnak 4: unknown flag; did you mean --lora_rank?``.
        """
        groups: list[list[str]] = []
        for word in words:
            # A word that starts a flag opens a group; a value (a negative number too) joins the flag before it.
            if not groups or (word.startswith("-") and not _is_number(word)):
                groups.append([word])
            else:
                groups[-1].append(word)
        flags = [option for action in self._actions for option in action.option_strings if action.dest != "help"]
        problems = []
        for group in groups:
            given, name = shlex.join(group), group[0].split("=", 1)[0]
            if not name.startswith("-") or _is_number(name):
                problems.append(f"{given}: a value that follows no flag taking it; drop it, or quote it together "
                                "with the value before it if both are one value")
                continue
            matches = closest_flags(name, flags)
            hint = f"did you mean {' or '.join(matches)}?" if matches else "no flag is close to it"
            problems.append(f"{given}: unknown flag; {hint}")
        return problems


def closest_flags(name: str, flags: Sequence[str], count: int = 3) -> list[str]:
    """The flags of ``flags`` closest to ``name``, best first: at most ``count``, each about as close as the best.

    ``difflib``'s similarity, at least 0.6 (its default), and within 0.1 of the best match: a clear typo such as
    ``--lora_rnak`` gets ``--lora_rank`` alone, not also ``--lora_alpha``.
    """
    matches = difflib.get_close_matches(name, flags, n=count)
    similarity = {flag: difflib.SequenceMatcher(None, name, flag).ratio() for flag in matches}
    return [flag for flag in matches if similarity[flag] >= similarity[matches[0]] - 0.1]


def _is_number(word: str) -> bool:
    """Whether ``word`` is a number (``-1``, ``-0.5``), which argparse takes as a value, not as a flag."""
    try:
        float(word)
    except ValueError:
        return False
    return True


def build_parser(description: str = "Train a LoRA or fine-tune a diffusion model.",
                 video: bool = False) -> FlagParser:
    """Builds the full trainer parser; ``video`` swaps the image size group for the video one (adds --num_frames)
    and turns gradient checkpointing on."""
    parser = FlagParser(description=description)
    add_config_file_argument(parser)
    for section in SECTIONS.values():
        section.add_arguments(parser, video=video)
    add_unsupported_config(parser)
    return parser


@dataclasses.dataclass(frozen=True)
class ParsedFlags:
    """The trainer flags parsed once (over a ``--config`` file's values), before torch is imported; the command line
    parses them, and the entry turns them into its ``RunConfig`` without parsing again.

    Attributes:
        namespace: The parsed values, read only by this package.
        parser: The parser that read them, which reports the problems found across sections.
    """

    namespace: argparse.Namespace
    parser: argparse.ArgumentParser

    def run_config(self) -> RunConfig:
        """The run's config, checked across sections (importing torch); on a problem prints every problem, one a
        line, then exits (status 2; :class:`FlagParser`)."""
        # Imported now: its checks across sections import torch, which a misspelled flag is answered without.
        from .run_config import RunConfig

        try:
            return RunConfig.from_namespace(self.namespace)
        except FlagError as error:
            self.parser.error("\n".join(error.problems))

    def uses_bitsandbytes(self) -> bool:
        """Whether the flags may need bitsandbytes (:func:`uses_bitsandbytes`)."""
        return uses_bitsandbytes(self.namespace)


def read_flags(argv: Sequence[str] | None = None, video: bool = False,
               parser: argparse.ArgumentParser | None = None) -> ParsedFlags:
    """Parses the trainer flags without the checks across sections, importing no torch (:func:`parse_flags`); on a
    problem prints every problem, one a line, then exits (status 2)."""
    parser = parser or build_parser(video=video)
    return ParsedFlags(parse_flags(argv, parser=parser), parser)


def parse_args(argv: Sequence[str] | None = None, video: bool = False,
               parser: argparse.ArgumentParser | None = None) -> RunConfig:
    """Parses and checks the trainer flags (over a ``--config`` file's values, :func:`parse_namespace`); on a problem
    prints every problem, one a line, then exits (status 2; :class:`FlagParser`).

    Args:
        argv: The arguments without the program name; None reads ``sys.argv``.
        video: Build the video parser (adds ``--num_frames``); ignored when ``parser`` is given.
        parser: A parser from :func:`build_parser`.

    Returns:
        The run's config.
    """
    return read_flags(argv, video=video, parser=parser).run_config()


def parse_flags(argv: Sequence[str] | None = None, video: bool = False,
                parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """Parses the trainer flags (over a ``--config`` file's values) without the checks across sections, importing no
    torch; on a problem prints every problem, one a line, then exits (status 2; :class:`FlagParser`).

    Args:
        argv: The arguments without the program name; None reads ``sys.argv``.
        video: Build the video parser (adds ``--num_frames``); ignored when ``parser`` is given.
        parser: A parser from :func:`build_parser`.
    """
    parser = parser or build_parser(video=video)
    try:
        return parse_namespace(parser, argv)
    except FlagError as error:
        parser.error("\n".join(error.problems))


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


def uses_bitsandbytes(namespace: argparse.Namespace) -> bool:
    """Whether the parsed flags may need bitsandbytes: NF4 weights (``--quant_options``, or a release packed in
    bitsandbytes' layout among the models), or an optimizer from outside torch (``--customized_optimizer``:
    bitsandbytes' own, or a class that may import it)."""
    from .quant_flags import packed_releases

    optimizer = namespace.customized_optimizer
    return ("bitsandbytes" in (namespace.quant_options or "")
            or bool(packed_releases(namespace.model_id_with_origin_paths, namespace.model_paths))
            or (optimizer is not None and not optimizer.startswith("torch.")))
