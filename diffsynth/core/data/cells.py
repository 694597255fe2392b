"""Typed metadata cells: a CSV cell is text, so a column a pipeline reads as a number is converted when read.

A pipeline declares the type of each input a metadata column may feed (Qwen-Image: ``seed`` an int,
``num_inference_steps`` a positive int, ``cfg_scale`` a finite float, ``rand_device`` a string). ``convert_row``
converts every row's cell of those columns at dataset construction, so a ``seed`` of ``"abc"`` in row 9,000 fails
before any model loads, naming the row, the column and the value; a JSON metadata file's numbers pass through the
same check. Integral floats (``4.0``, ``"4.0"``) count as ints; booleans are not numbers here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

CellType = Callable[[Any], Any]


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError("is not a number")
    try:
        number = float(value)
    except ValueError:
        raise ValueError("is not a number") from None
    if not math.isfinite(number):
        raise ValueError("is not a finite number")
    return number


def integer(value: Any) -> int:
    """A cell as an int (``"4"``, ``4``, ``4.0``)."""
    number = _number(value)
    if number != int(number):
        raise ValueError("is not a whole number")
    return int(number)


def positive_integer(value: Any) -> int:
    """A cell as an int of at least 1."""
    number = integer(value)
    if number < 1:
        raise ValueError("must be at least 1")
    return number


def non_negative_integer(value: Any) -> int:
    """A cell as an int of at least 0."""
    number = integer(value)
    if number < 0:
        raise ValueError("must be at least 0")
    return number


def real(value: Any) -> float:
    """A cell as a finite float."""
    return _number(value)


def text(value: Any) -> str:
    """A cell as a non-empty string (a number written unquoted in JSON is turned into its text)."""
    if isinstance(value, (dict, list)) or value is None or not str(value).strip():
        raise ValueError("is not a non-empty string")
    return str(value).strip()


_EXAMPLES = {integer: "0", positive_integer: "4", real: "4.0", text: "cpu"}


def convert_row(row: Mapping[str, Any], column_types: Mapping[str, CellType]) -> tuple[dict[str, Any], list[str]]:
    """``row`` with each cell of the typed columns converted (a column the row lacks is left out), and one problem
    per cell that does not convert.

    Returns:
        The converted row, and the problems, each naming the column, the value and an example of what the column
        takes (``column 'seed' holds 'abc', which is not a number; ...``); the caller adds the row.
    """
    converted, problems = dict(row), []
    for column, convert in column_types.items():
        if column not in converted:
            continue
        try:
            converted[column] = convert(converted[column])
        except ValueError as error:
            example = _EXAMPLES.get(convert, "")
            problems.append(f"column {column!r} holds {row[column]!r}, which {error}; the pipeline reads {column} as "
                            f"{convert.__name__.replace('_', ' ')}" + (f" (e.g. {example})" if example else ""))
    return converted, problems
