"""Config files: ``--config run.yaml`` (or ``.toml``) holds flag values under the flags' own names, and every training
run writes the flags it resolved as ``<output_path>/config.yaml``, which reruns it.

A file is a top-level mapping of flag names (without ``--``) to values, and may hold a ``datasets:`` list (several
datasets, ``dataset_entries``). Each value is converted as the command line
converts the flag's text (its argparse ``type`` and ``choices``), so ``learning_rate: 1e-4`` works although YAML 1.1
reads ``1e-4`` as a string; switches take booleans. Every problem of a file (an unknown key, with the nearest flag
name; a wrong value; a key given twice) is reported at once. The parser applies the file under the command line:
a flag given there overrides the file (``parsers.parse_namespace``).
"""

from __future__ import annotations

import argparse
import difflib
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ...core.files import atomic_write_text
from .dataset_entries import DATASETS_KEY
from .errors import FlagError

if TYPE_CHECKING:
    from .run_config import RunConfig

#: Config file suffix -> its format.
FORMATS = {".yaml": "YAML", ".yml": "YAML", ".toml": "TOML"}
# How a typed flag's value is named in a problem, and an example value of that type.
_KINDS = {int: ("an integer", 1), float: ("a number", 1.0)}


#: The flags a training run resolved, which ``--config`` reruns (:func:`save_run_config`).
RUN_CONFIG_FILE = "config.yaml"


def add_config_file_argument(parser: argparse.ArgumentParser) -> None:
    """Adds the Config file group: ``--config``."""
    group = parser.add_argument_group("Config file")
    group.add_argument("--config", type=str, default=None,
                       help="A YAML (.yaml, .yml) or TOML (.toml) file of flag values under the flags' names without "
                            "--, e.g. learning_rate: 1e-4. Flags given on the command line override the file. Every "
                            f"training run writes its resolved flags as <output_path>/{RUN_CONFIG_FILE}, which reruns "
                            "it.")


class _Loader(yaml.SafeLoader):
    """YAML's safe loader, also recording each mapping key given more than once, with its lines."""

    def __init__(self, text: str, name: str):
        super().__init__(text)
        self.name = name  # what its error messages call the file
        self.repeated: dict[str, list[int]] = {}

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        lines: dict[str, list[int]] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                lines.setdefault(key_node.value, []).append(key_node.start_mark.line + 1)
        self.repeated.update({key: found for key, found in lines.items() if len(found) > 1})
        return super().construct_mapping(node, deep)


def _load(path: Path) -> tuple[Any, list[str]]:
    """The file's content, and its keys given twice as problems.

    Raises:
        FlagError: The suffix is not a config file's, or the file is missing, unreadable or not valid YAML / TOML.
    """
    where = f"--config {path}"
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise FlagError([f"{where}: the suffix {path.suffix or '(none)'!r} is not a config file's; write the file as "
                         f"YAML (.yaml, .yml) or TOML (.toml) and name it so"])
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as error:
        raise FlagError([f"{where}: no such file (a relative path is read from {Path.cwd()}); check the path"]) \
            from error
    except (OSError, UnicodeDecodeError) as error:
        raise FlagError([f"{where} cannot be read ({type(error).__name__}: {error}); check the file"]) from error
    if kind == "TOML":
        return _read_toml(text, where), []
    loader = _Loader(text, str(path))
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as error:
        raise FlagError([f"{where} is not valid YAML ({' '.join(str(error).split())}); fix the line it names"]) \
            from error
    finally:
        loader.dispose()
    return data, [f"{where}: the key {key!r} is given {len(lines)} times (lines {', '.join(map(str, lines))}); "
                  "keep one" for key, lines in loader.repeated.items()]


def _read_toml(text: str, where: str) -> dict[str, Any]:
    try:
        import tomllib  # here: Python 3.10, which the package supports, has none
    except ModuleNotFoundError as error:
        raise FlagError([f"{where}: reading TOML needs Python 3.11 or later (its tomllib); write the file as YAML "
                         "(.yaml), or run on a newer Python"]) from error
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise FlagError([f"{where} is not valid TOML ({error}); fix the line it names"]) from error


def _converted(action: argparse.Action, key: str, value: Any) -> Any:
    """``value`` as the parser gives the flag of ``action`` from the command line.

    Raises:
        ValueError: The value does not fit the flag; the message says what to write.
    """
    flag = action.option_strings[0]
    if isinstance(action, argparse._StoreTrueAction):
        if isinstance(value, bool):
            return value
        raise ValueError(f"{value!r}, but {flag} is a switch; write {key}: true (or false)")
    if value is None:
        if action.default is None:
            return None
        raise ValueError(f"null, but {flag} has no unset value (its default is {action.default!r}); write a value, "
                         "or drop the key for the default")
    kind, example = _KINDS.get(action.type, ("a string", None))
    example = action.default if action.default is not None else example
    if isinstance(value, bool):
        words = ("yes", "on", "true") if value else ("no", "off", "false")
        word = next((word for word in words if word in (action.choices or ())), words[1])
        raise ValueError(f"{value} is a boolean, but {flag} takes {kind}: YAML reads yes, no, on, off, true and false "
                         f"unquoted as booleans; quote the word, e.g. {key}: \"{word}\"")
    if not isinstance(value, (str, int, float)):
        raise ValueError(f"{value!r} is a {type(value).__name__}, but {flag} takes one value ({kind}); write what the "
                         "command line takes (a comma list is one string, e.g. \"a,b\")")
    try:
        converted = action.type(str(value)) if action.type else str(value)
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        raise ValueError(f"{value!r} is not {kind}, as {flag} needs; write e.g. {key}: {example}") from None
    if action.choices and converted not in action.choices:
        raise ValueError(f"{value!r} is not a choice of {flag}; write one of {', '.join(map(str, action.choices))}")
    return converted


def read_config_file(path: str | os.PathLike, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The flag values of a config file, converted as ``parser`` converts them from the command line.

    Args:
        path: A ``.yaml`` / ``.yml`` (YAML) or ``.toml`` (TOML) file holding a mapping of flag names (without ``--``;
            an alias such as ``gradient_checkpointing`` works too) to values.
        parser: The trainer's parser (:func:`~diffsynth.training.config.parsers.build_parser`).

    Returns:
        Flag name (argparse ``dest``) -> value, in the file's order.

    Raises:
        FlagError: Every problem of the file at once, each naming the file, the key and the fix.
    """
    path = Path(path)
    where = f"--config {path}"
    data, problems = _load(path)
    if not isinstance(data, dict):
        raise FlagError([f"{where} holds {'nothing' if data is None else f'a {type(data).__name__}'}, not a mapping of "
                         "flag names to values; write one flag per line, e.g. learning_rate: 1e-4"])
    actions = {option[2:]: action for action in parser._actions for option in action.option_strings
               if option.startswith("--") and action.dest not in ("help", "config")}
    values: dict[str, Any] = {}
    keys: dict[str, str] = {}  # dest -> the key that gave it
    for key, value in data.items():
        action = actions.get(key) if isinstance(key, str) else None
        if key == DATASETS_KEY:  # a list of mappings, which no flag takes: the dataset section checks it
            values[DATASETS_KEY] = value
        elif key == "config":
            problems.append(f"{where}: the key 'config' names another config file, which a config file cannot; drop "
                            "it (and copy what that file sets into this one)")
        elif action is None:
            match = difflib.get_close_matches(str(key).lstrip("-"), actions, n=1)
            hint = f"did you mean {match[0]}?" if match else "see --help for the flags"
            problems.append(f"{where}: unknown key {key!r}; {hint} (keys are the trainer's flags without --)")
        elif action.dest in keys:
            problems.append(f"{where}: the keys {keys[action.dest]!r} and {key!r} both set {action.option_strings[0]}; "
                            "keep one")
        else:
            keys[action.dest] = key
            try:
                values[action.dest] = _converted(action, key, value)
            except ValueError as error:
                problems.append(f"{where}: {key}: {error}")
    if problems:
        raise FlagError(problems)
    return values


def write_config_file(path: str | os.PathLike, flags: Mapping[str, Any], header: str) -> Path:
    """Writes ``flags`` (name -> value, in the order given) as a YAML config file, atomically.

    Every value reads back as the same Python value (a float as a float, e.g. ``1.0e-05``; None as ``null``; a
    string YAML would read as something else quoted).

    Args:
        path: The file.
        flags: Flag name -> a string, number, boolean or None.
        header: The leading comment, without ``#``; one line of it per line of text.

    Returns:
        ``path`` as a ``Path``.
    """
    comment = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    body = yaml.safe_dump(dict(flags), sort_keys=False, allow_unicode=True, default_flow_style=False, width=2 ** 16)
    return atomic_write_text(path, comment + body)


def save_run_config(config: RunConfig, run_id: str) -> Path:
    """Writes ``<output_path>/config.yaml``: the flags of training run ``run_id`` as it resolved them, in ``--help``
    order, so that ``--config`` of the file (with another ``--output_path``) trains the same weights.

    The file holds the seed the run trains with (drawn when ``--seed`` was unset) and the placement it trains with
    (the memory planner's, whose budgets are then left out). It neither deletes nor resumes anything when rerun:
    ``--overwrite_output`` is written false, and a ``--resume_from_checkpoint`` that continued a training state is
    left out, so the file describes the run from its start (a weights file to start from is kept). Call it on the
    main process only.

    Args:
        config: The config the run trains with (seed and placement resolved).
        run_id: The run's id, named in the file's header.

    Returns:
        The path of the file.
    """
    from .parsers import build_parser  # here, not at the top: parsers reads config files through this module

    resolved = {**config.to_flags(), "overwrite_output": False}
    resumed = config.training.resume_checkpoint
    if resumed:
        resolved["resume_from_checkpoint"] = None
    if config.placement.planned:
        resolved.update(vram_budget=None, ram_budget=None)
    order = [action.dest for action in build_parser(video=config.dataset.num_frames is not None)._actions]
    path = Path(config.output.output_path) / RUN_CONFIG_FILE
    rerun = shlex.join(["accelerate", "launch", sys.argv[0], "--config", str(path), "--output_path", "OTHER_FOLDER"])
    header = "\n".join([
        f"The flags of training run {run_id} as it resolved them (its seed, drawn if --seed was unset; the memory",
        "planner's placement), written by diffsynth.training when it started. Rerun it, training the same weights",
        "(bit-identical on the CPU; on a GPU some kernels are not deterministic):",
        f"  {rerun}",
        "Flags on the command line override the values here (docs/en/Config_Files.md). Rerunning the file deletes and",
        "resumes nothing: --overwrite_output is false and a resume is left out.",
        *([f"This run resumed (--resume_from_checkpoint {resumed}); the file describes it from its start."]
          if resumed else []),
    ])
    return write_config_file(path, {name: resolved[name] for name in order if name in resolved} | resolved, header)
