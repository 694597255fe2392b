"""Several datasets and regularization images: the ``datasets:`` entries of a config file, and the checks of the
regularization flags (docs Datasets).

A config file's ``datasets:`` is a list of mappings, one per dataset, each with its own folder, metadata file,
repeats, size and file columns (the keys of :data:`ENTRY_KEYS`); what an entry leaves out it takes from the run's
flags (``--dataset_base_path``, ``--height``, ``--max_pixels``, ``--data_file_keys``, ...). An entry with
``is_reg: true`` holds regularization (prior-preservation) images, as ``--reg_dataset_metadata_path`` does. This module
turns the file's list into checked :class:`DatasetEntry` values; every problem of every entry is reported at once,
each naming ``datasets[i].key``, the value and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import split_csv

#: The config file key that holds the list of datasets (it has no command-line flag).
DATASETS_KEY = "datasets"
# The image and video size rules of the run's own flags (config.dataset), restated here to keep this module a leaf.
SIZE_MULTIPLE = 16
MIN_PIXELS = 256


@dataclasses.dataclass(frozen=True)
class DatasetEntry:
    """One dataset of a run: where its rows are, how often an epoch reads them and how its samples are sized.

    ``None`` fields take the run's flags (:meth:`resolved`).

    Attributes:
        metadata_path: The metadata file (``.csv``, ``.json``, ``.jsonl``).
        base_path: The folder its file paths are relative to.
        repeats: Times an epoch reads each row (at least 1).
        height: Fixed sample height (with ``width``); otherwise sizes follow ``max_pixels``.
        width: Fixed sample width.
        max_pixels: Pixel budget per sample (and the bucket budget with buckets).
        num_frames: Frames per video sample (the video trainer).
        data_file_keys: Comma list of the columns that hold file paths.
        is_reg: Regularization images: drawn in kohya's proportion and weighted by ``--prior_loss_weight``.
    """

    metadata_path: str
    base_path: str | None = None
    repeats: int = 1
    height: int | None = None
    width: int | None = None
    max_pixels: int | None = None
    num_frames: int | None = None
    data_file_keys: str | None = None
    is_reg: bool = False

    def resolved(self, defaults: Mapping[str, Any]) -> DatasetEntry:
        """This entry with every unset field taken from ``defaults`` (field name -> the run's value).

        An entry that sets its size (``height`` and ``width``, or ``max_pixels``) is sized by it alone: the run's
        fixed ``--height``/``--width`` would otherwise win over the entry's pixel budget.
        """
        values = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        if self.height is not None or self.max_pixels is not None:
            defaults = {**defaults, "height": None, "width": None}
        return DatasetEntry(**{name: defaults.get(name) if value is None else value for name, value in values.items()})

    def to_config(self) -> dict[str, Any]:
        """The entry as a config file writes it: only the keys it sets."""
        defaults = DatasetEntry(metadata_path="")
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
                if field.name == "metadata_path" or getattr(self, field.name) != getattr(defaults, field.name)}

    @property
    def file_keys(self) -> list[str]:
        """The columns holding file paths (``data_file_keys``)."""
        return split_csv(self.data_file_keys)


# Key -> (accepted types, the type's name, an example value).
ENTRY_KEYS: dict[str, tuple[tuple[type, ...], str, str]] = {
    "metadata_path": ((str,), "a path", "data/cats/metadata.csv"),
    "base_path": ((str,), "a path", "data/cats"),
    "repeats": ((int,), "an integer", "2"),
    "height": ((int,), "an integer", "512"),
    "width": ((int,), "an integer", "512"),
    "max_pixels": ((int,), "an integer", "1048576"),
    "num_frames": ((int,), "an integer", "49"),
    "data_file_keys": ((str, list), "a comma list", "image,video"),
    "is_reg": ((bool,), "true or false", "true"),
}


def parse_entries(value: Any, video: bool = True) -> tuple[tuple[DatasetEntry, ...], list[str]]:
    """The checked entries of a config file's ``datasets:`` value, and every problem found.

    Args:
        value: What the file holds under ``datasets`` (a list of mappings), or already parsed entries.
        video: Whether the trainer reads videos (``num_frames`` is a key only then).

    Returns:
        ``(entries, problems)``: the entries without problems, and one message per problem.
    """
    if isinstance(value, tuple) and all(isinstance(entry, DatasetEntry) for entry in value):
        return value, [problem for index, entry in enumerate(value) for problem in entry_problems(index, entry)]
    if not isinstance(value, list) or not value:
        return (), [(f"datasets: holds {value!r}, not a list of datasets; write one mapping per dataset, e.g. "
                    "datasets: [{metadata_path: data/cats/metadata.csv, base_path: data/cats, repeats: 2}]")]
    entries, problems = [], []
    for index, item in enumerate(value):
        entry, found = _parse_entry(index, item, video)
        problems += found
        if entry is not None:
            entries.append(entry)
    if entries and all(entry.is_reg for entry in entries) and len(entries) == len(value):
        problems.append("datasets: every entry has is_reg: true; add the training images as an entry without is_reg "
                        "(regularization images only preserve what the model knows)")
    return tuple(entries), problems


def _parse_entry(index: int, item: Any, video: bool) -> tuple[DatasetEntry | None, list[str]]:
    where = f"datasets[{index}]"
    if not isinstance(item, Mapping):
        return None, [(f"{where} holds {item!r}, not a mapping; write e.g. {{metadata_path: data/cats/metadata.csv, "
                      "repeats: 2}")]
    keys = {name: spec for name, spec in ENTRY_KEYS.items() if video or name != "num_frames"}
    problems, values = [], {}
    for key, given in item.items():
        if key not in keys:
            match = difflib.get_close_matches(str(key), keys, n=1)
            hint = f"did you mean {match[0]}?" if match else f"the keys are {', '.join(keys)}"
            problems.append(f"{where}: unknown key {key!r}; {hint}")
            continue
        types, kind, example = keys[key]
        if given is None:
            continue  # an explicit null: the run's flag
        if not isinstance(given, types) or (bool not in types and isinstance(given, bool)):
            problems.append(f"{where}.{key} is {given!r}, not {kind}; write e.g. {key}: {example}")
            continue
        if key == "data_file_keys" and isinstance(given, list):
            if not all(isinstance(name, str) for name in given):
                problems.append(f"{where}.data_file_keys is {given!r}; list column names, e.g. [image, video]")
                continue
            given = ",".join(given)
        values[key] = given
    if "metadata_path" not in values:
        problems.append(f"{where} has no metadata_path; add the dataset's metadata file, e.g. metadata_path: "
                        "data/cats/metadata.csv")
    if problems:
        return None, problems
    entry = DatasetEntry(**values)
    found = entry_problems(index, entry)
    return (None if found else entry), found


def entry_problems(index: int, entry: DatasetEntry) -> list[str]:
    """The value problems of entry ``index``: repeats, sizes and frame counts out of range."""
    where = f"datasets[{index}]"
    problems = []
    if entry.repeats < 1:
        problems.append(f"{where}.repeats {entry.repeats} must be at least 1 (1 reads each row once an epoch); write "
                        "e.g. repeats: 2")
    if (entry.height is None) != (entry.width is None):
        problems.append(f"{where} gives {'height' if entry.width is None else 'width'} without "
                        f"{'width' if entry.width is None else 'height'}; give both for a fixed size, or neither")
    for key in ("height", "width"):
        value = getattr(entry, key)
        if value is not None and (value <= 0 or value % SIZE_MULTIPLE):
            nearest = max(SIZE_MULTIPLE, round(value / SIZE_MULTIPLE) * SIZE_MULTIPLE)
            problems.append(f"{where}.{key} {value} must be a positive multiple of {SIZE_MULTIPLE}; write e.g. "
                            f"{key}: {nearest}")
    if entry.max_pixels is not None and entry.max_pixels < MIN_PIXELS:
        problems.append(f"{where}.max_pixels {entry.max_pixels} must be at least {MIN_PIXELS}; write e.g. "
                        "max_pixels: 1048576")
    if entry.num_frames is not None and (entry.num_frames < 1 or entry.num_frames % 4 != 1):
        problems.append(f"{where}.num_frames {entry.num_frames} must be 4k+1 (e.g. 49 or 81)")
    if entry.data_file_keys is not None and not entry.file_keys:
        problems.append(f"{where}.data_file_keys is empty; name the file columns, e.g. data_file_keys: image")
    return problems


def regularization_problems(stage: str | None, task: str, family: str, datasets: Sequence[DatasetEntry],
                            metadata_path: str | None, reg_metadata_path: str | None, reg_base_path: str | None,
                            prior_loss_weight: float) -> list[str]:
    """The checks of ``datasets:`` and the regularization flags against the task's stage and each other."""
    problems = []
    reg_given = reg_metadata_path is not None or any(entry.is_reg for entry in datasets)
    if reg_base_path is not None and reg_metadata_path is None:
        problems.append(f"--reg_dataset_base_path {reg_base_path} has no effect without --reg_dataset_metadata_path; "
                        "add the regularization images' metadata file, or drop it")
    if datasets and metadata_path:
        problems.append(f"--dataset_metadata_path {metadata_path} and the config file's datasets: list both name the "
                        "training data; list that dataset as an entry of datasets: instead, or drop datasets:")
    if stage == "train":
        given = ([f"--reg_dataset_metadata_path {reg_metadata_path}"] if reg_metadata_path else []) + (
            ["the config file's datasets: list"] if datasets else [])
        problems += [f"{what}: --task {task} reads the stage-1 cache in --dataset_base_path, which holds every dataset "
                     f"and the regularization rows stage 1 was given (with their repeats); drop it here and pass it to "
                     f"the {family}:data_process run" for what in given]
        return problems
    if prior_loss_weight != 1.0 and not reg_given:
        problems.append(f"--prior_loss_weight {prior_loss_weight} has no effect without regularization images; add "
                        "--reg_dataset_metadata_path (or a datasets: entry with is_reg: true), or drop it")
    if stage == "data_process" and prior_loss_weight != 1.0:
        problems.append(f"--prior_loss_weight {prior_loss_weight} has no effect on --task {task}, which trains "
                        f"nothing; pass it to the {family}:train run")
    return problems
