"""Reading a metadata file (``--dataset_metadata_path``) into rows, and the one error that names every problem of
its rows.

A metadata file is a ``.csv`` (one row a line after the header), a ``.json`` list of objects, or a ``.jsonl`` file with
one object a line. A problem of the file as a whole (missing, not UTF-8, not valid JSON) stops reading at once; the
problems of single rows (a CSV row with more cells than the header, a JSON row that is not an object, a JSONL line
that is not JSON) are collected, and :func:`raise_row_problems` reports them together: a dataset with four bad rows
is fixed in one run, not four. The dataset's own checks of the cells and files (``dataset.check_dataset``) report
through it too.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import DataFileNotFoundError, DatasetError

METADATA_EXTENSIONS = (".csv", ".json", ".jsonl")
#: How many problems of the rows one error lists; the others are counted.
PROBLEMS_SHOWN = 20


def read_metadata(metadata_path: str | os.PathLike) -> tuple[list[dict[str, Any]], list[str]]:
    """Reads the rows of a ``.csv``, ``.json`` or ``.jsonl`` metadata file.

    Args:
        metadata_path: The file (``--dataset_metadata_path``).

    Returns:
        The rows, and the column names in the order first seen (for CSV, the header).

    Raises:
        DataFileNotFoundError: The file does not exist.
        DatasetError: Unsupported extension, undecodable text, malformed JSON or CSV.
    """
    path = Path(metadata_path)
    extension = path.suffix.lower()
    if extension not in METADATA_EXTENSIONS:
        raise DatasetError(
            f"--dataset_metadata_path {path} has extension {extension or '(none)'!r}; use a .csv file, a .json list "
            "of objects, or a .jsonl file with one object per line"
        )
    if not path.is_file():
        raise DataFileNotFoundError(f"--dataset_metadata_path {path} does not exist; check the path")
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: spreadsheets often prepend a byte-order mark
    except UnicodeDecodeError as error:
        raise DatasetError(f"metadata {path} is not UTF-8 text ({error}); re-save it as UTF-8") from error
    if extension == ".csv":
        rows, columns = _read_csv(path, text)
    else:
        rows = _read_json(path, text) if extension == ".json" else _read_jsonl(path, text)
        columns = list(dict.fromkeys(key for row in rows for key in row))
    return rows, columns


def _read_csv(path: Path, text: str) -> tuple[list[dict[str, Any]], list[str]]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    # Spaces after the commas of a hand-written header would otherwise become part of the column names.
    columns = [name.strip() for name in reader.fieldnames or []]
    reader.fieldnames = columns
    rows = list(reader)
    raise_row_problems(path, [DatasetError(
        f"row {number} has more cells than the header ({', '.join(columns)}); quote cells that contain commas "
        '("a cat, sitting") or add the missing column to the header'
    ) for number, row in enumerate(rows, start=1) if None in row])
    return rows, columns


def _read_json(path: Path, text: str) -> list[dict[str, Any]]:
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as error:
        raise DatasetError(f"metadata {path} is not valid JSON ({error}); fix the file") from error
    if not isinstance(rows, list):
        raise DatasetError(
            f"metadata {path} holds a JSON {type(rows).__name__}; it must be a list of objects such as "
            '[{"image": "1.jpg", "prompt": "a cat"}]'
        )
    raise_row_problems(path, [_object_problem(number, row) for number, row in enumerate(rows, start=1)
                              if not isinstance(row, dict)])
    return rows


def _read_jsonl(path: Path, text: str) -> list[dict[str, Any]]:
    rows, problems = [], []
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            problems.append(DatasetError(f"line {line_number} is not valid JSON ({error}); fix that line"))
            continue
        rows.append(row)
        if not isinstance(row, dict):
            problems.append(_object_problem(len(rows), row))
    raise_row_problems(path, problems)
    return rows


def _object_problem(number: int, row: Any) -> DatasetError:
    return DatasetError(f"row {number} is a JSON {type(row).__name__}; every row must be an object such as "
                        '{"image": "1.jpg", "prompt": "a cat"}')


def raise_row_problems(metadata_path: str | os.PathLike,
                       problems: Sequence[DatasetError | DataFileNotFoundError]) -> None:
    """Raises one error for every problem found in the rows of a metadata file, or returns if there is none.

    Args:
        metadata_path: The metadata file, which the message names once.
        problems: One error per problem, in row order, each message starting with where it is (``row 3 column
            'image': ...``).

    Raises:
        DataFileNotFoundError: Every problem is a missing data file.
        DatasetError: Any other problem; several are listed one a line (the first ``PROBLEMS_SHOWN``) with their
            total.
    """
    if not problems:
        return
    if len(problems) == 1:
        raise type(problems[0])(f"metadata {metadata_path} {problems[0]}") from problems[0]
    kind = DataFileNotFoundError if all(isinstance(problem, DataFileNotFoundError) for problem in problems) \
        else DatasetError
    shown = "\n  ".join(str(problem) for problem in problems[:PROBLEMS_SHOWN])
    more = f"\n  ... and {len(problems) - PROBLEMS_SHOWN} more" if len(problems) > PROBLEMS_SHOWN else ""
    raise kind(f"metadata {metadata_path} has {len(problems)} problems:\n  {shown}{more}\nFix them (or remove "
               "those rows) and run again")
