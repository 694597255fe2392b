"""What earlier runs left in an output folder, and which of it ``--overwrite_output`` removes: the trainer's files only.

A file is the trainer's when the run that wrote it recorded it (:mod:`diffsynth.core.written_files`: every atomic
write, the checkpoint folders, the CSV and TensorBoard logs) and it is unchanged since; a file someone replaced or
edited after the run wrote it is not. A folder written by a version that kept no record has instead the files that
carry the trainer's marks: LoRA and weight files whose metadata names ``diffsynth_version``, checkpoint files beside
a ``progress.json`` with a run id, ``training_args.json`` with a run id, a ``config.yaml`` that says it was written
by ``diffsynth.training``, and cache files in the stage-1 cache format. A run that continues such a folder (a resume,
a stage-1 rerun) records those as its own.

Every other file with the name of a trainer output (:data:`TRAINING_OUTPUTS`, :data:`STAGE_ONE_OUTPUTS`: another
tool's ``epoch-3.safetensors``, another experiment's TensorBoard events, an older version's ``logs/loss.png``) is
someone else's and is kept. Those that a new run would write over in place (:data:`WRITTEN_IN_PLACE`, e.g.
``logs/metrics.csv``, which the logger appends to) are named in the refusal instead, to be moved by hand.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ...core.data.cache import CACHE_INFO_FILE, CACHE_MANIFEST_FILE
from ...core.data.mix import MIX_CACHE_DIR, MIX_MANIFEST_FILE
from ...core.written_files import record_files, recorded_files
from ..config.files import RUN_CONFIG_FILE
from .checkpoint import CHECKPOINTS_DIR, EMA_FILE
from .logger import DIFFUSERS_TWIN_SUFFIX, METRICS_FILE, SAMPLES_DIR, TENSORBOARD_DIR, TRAINING_ARGS_FILE
from .loss_chart import LOSS_CHART_FILE
from .run_report import REPORT_FILE, REPORT_MARK

logger = logging.getLogger(__name__)

_CHECKPOINT_FILES = ("trainable.safetensors", "state.safetensors", EMA_FILE, "progress.json")


def _with_temporary(*names: str) -> tuple[str, ...]:
    """Patterns for ``names`` and for the temporary files ``core.files.atomic_write`` leaves when killed mid-write."""
    return tuple(pattern for name in names for pattern in (re.escape(name), rf"\.{re.escape(name)}\..+\.tmp"))


# A LoRA file's name without its extension: the diffusers twin (logger.DIFFUSERS_TWIN_SUFFIX) is the run's too.
_LORA_FILE = rf"(epoch|step)-\d+({re.escape(DIFFUSERS_TWIN_SUFFIX)})?"
# The names of the files a training run writes: a regular expression for the sub-folder, one per path segment ("" for
# the output folder itself), mapped to regular expressions for the file names in it.
TRAINING_OUTPUTS: dict[str, tuple[str, ...]] = {
    "": (rf"{_LORA_FILE}\.safetensors", rf"\.{_LORA_FILE}\.safetensors\..+\.tmp",
         *_with_temporary(TRAINING_ARGS_FILE, RUN_CONFIG_FILE)),
    rf"{re.escape(CHECKPOINTS_DIR)}/(step-\d+|\.step-\d+\.tmp)": _with_temporary(*_CHECKPOINT_FILES),
    rf"{re.escape(SAMPLES_DIR)}/step-\d+": (r"\d+\.\w+", r"\.\d+\.\w+\..+\.tmp"),
    re.escape(METRICS_FILE.parent.as_posix()): _with_temporary(METRICS_FILE.name, LOSS_CHART_FILE.name,
                                                                    REPORT_FILE.name),
    "/".join(map(re.escape, TENSORBOARD_DIR.parts)): (r"events\.out\.tfevents\..+",),
}
# A stage-1 cache: its info and manifest files and <process index>/<sample index>.safetensors; for several datasets,
# one such cache each under datasets/<k>, and the list of them.
_CACHE_FILES = (r"\d+\.safetensors", r"\.\d+\.safetensors\..+\.tmp")
STAGE_ONE_OUTPUTS: dict[str, tuple[str, ...]] = {
    "": _with_temporary(CACHE_INFO_FILE, CACHE_MANIFEST_FILE, MIX_MANIFEST_FILE),
    r"\d+": _CACHE_FILES,
    rf"{MIX_CACHE_DIR}/\d+": _with_temporary(CACHE_INFO_FILE, CACHE_MANIFEST_FILE),
    rf"{MIX_CACHE_DIR}/\d+/\d+": _CACHE_FILES,
}
#: Per kind of run (stage 1 or not): the files a new run writes over (or appends to) at a fixed name.
WRITTEN_IN_PLACE: dict[bool, tuple[str, ...]] = {
    False: (TRAINING_ARGS_FILE, RUN_CONFIG_FILE, METRICS_FILE.as_posix(), LOSS_CHART_FILE.as_posix(),
            REPORT_FILE.as_posix()),
    True: (CACHE_INFO_FILE, CACHE_MANIFEST_FILE, MIX_MANIFEST_FILE),
}


def previous_outputs(folder: str | os.PathLike, outputs: Mapping[str, tuple[str, ...]]) -> list[Path]:
    """The files under ``folder`` with the names of ``outputs`` (e.g. :data:`TRAINING_OUTPUTS`), whoever wrote them."""
    folder = Path(folder)
    found = []
    for parent_pattern, names in outputs.items():
        parents = [folder]
        for segment in parent_pattern.split("/") if parent_pattern else ():
            parents = [child for parent in parents for child in _children(parent)
                       if child.is_dir() and not child.is_symlink() and re.fullmatch(segment, child.name)]
        for parent in parents:
            found += [path for path in _children(parent)
                      if path.is_file() and any(re.fullmatch(name, path.name) for name in names)]
    return sorted(found)


def _children(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


@dataclass(frozen=True)
class EarlierOutputs:
    """An output folder's files from earlier runs.

    Attributes:
        folder: The output folder.
        ours: The trainer's files (see the module docstring): what ``--overwrite_output`` removes.
        others: Files with a trainer output's name that are not the trainer's: kept.
        recorded: Whether the folder holds a record of written files (False: ``ours`` are known by their marks).
    """

    folder: Path
    ours: list[Path]
    others: list[Path]
    recorded: bool

    def in_the_way(self, stage_one: bool) -> list[Path]:
        """The ``others`` that a new run would write over at a fixed name (:data:`WRITTEN_IN_PLACE`)."""
        return [path for path in self.others
                if path.relative_to(self.folder).as_posix() in WRITTEN_IN_PLACE[stage_one]]


def earlier_outputs(folder: str | os.PathLike, outputs: Mapping[str, tuple[str, ...]]) -> EarlierOutputs:
    """Sorts the files of earlier runs in ``folder`` into the trainer's and others' (see the module docstring)."""
    folder = Path(folder)
    named = previous_outputs(folder, outputs)
    recorded = bool(record_files(folder))
    ours = recorded_files(folder) if recorded else [path for path in named if _bears_marks(path)]
    mine = set(ours)
    return EarlierOutputs(folder, ours, [path for path in named if path not in mine], recorded)


def remove_outputs(folder: str | os.PathLike, paths: list[Path]) -> None:
    """Deletes the files ``paths``, then the folders under ``folder`` that this left empty, then the record of
    written files (the files it listed that are kept are no longer the trainer's)."""
    folder = Path(folder)
    removed = [*paths, *record_files(folder)]
    for path in removed:
        path.unlink(missing_ok=True)
    emptied = {parent for path in removed for parent in path.parents
               if parent.is_relative_to(folder) and parent != folder}
    for parent in sorted(emptied, key=lambda path: len(path.parts), reverse=True):
        try:
            parent.rmdir()
        except OSError:
            pass  # it holds something that is not the trainer's, or was never there


def listing(folder: Path, paths: list[Path], limit: int = 8) -> str:
    """``paths`` relative to ``folder``, shallowest first (the LoRA files before each checkpoint's), at most ``limit``
    of them, then how many more."""
    names = sorted((path.relative_to(folder).as_posix() for path in paths), key=lambda name: (name.count("/"), name))
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _bears_marks(path: Path) -> bool:
    """Whether a file with a trainer output's name in a folder without a record was written by this trainer."""
    try:
        if path.parent.parent.name == CHECKPOINTS_DIR and path.name in _CHECKPOINT_FILES:
            progress = json.loads((path.parent / "progress.json").read_text(encoding="utf-8"))
            return isinstance(progress, dict) and "run_id" in progress and "global_step" in progress
        if path.name == TRAINING_ARGS_FILE:
            return "run_id" in json.loads(path.read_text(encoding="utf-8"))
        if path.name == RUN_CONFIG_FILE:
            return "written by diffsynth.training" in path.read_text(encoding="utf-8")[:2000]
        if path.name == REPORT_FILE.name:
            return REPORT_MARK in path.read_text(encoding="utf-8")[:2000]
        if path.name in (CACHE_INFO_FILE, CACHE_MANIFEST_FILE, MIX_MANIFEST_FILE):
            return "format_version" in json.loads(path.read_text(encoding="utf-8"))
        if path.suffix == ".safetensors":
            return any(key == "diffsynth_version" or key.startswith("diffsynth.") for key in _metadata(path))
    except (OSError, ValueError, TypeError):
        return False
    return False  # logs (but the report page), samples, TensorBoard events and temporary files carry no mark


def _metadata(path: Path) -> dict[str, str]:
    """A safetensors file's metadata, read from its header alone."""
    with open(path, "rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        if not 0 < length <= 100 * 2**20:
            return {}
        header = json.loads(handle.read(length))
    return header.get("__metadata__") or {} if isinstance(header, dict) else {}
