"""The families table: one row per registered family, read from the registry (``diffsynth-launch families``).

    diffsynth-launch families [--format text|markdown]
    python -m diffsynth.pipelines.families_table [the same]

Every value comes from a family's ``FamilySpec`` (``registry.families()``) or from its example folder on disk, so the
table, and the docs' copy of it (``docs/en/Training.md``, kept current by ``scripts/update_family_docs.py``), cannot
drift from the code. Building it imports only the specs, which are data: no torch, no diffusers, so it answers at once.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .registry import FamilySpec, families

REPO = Path(__file__).resolve().parents[2]
# ``lora.formats.LAYOUTS``: the LoRA layouts written for any family (the trainer writes ``universal``, ``kohya`` with
# ``--align_to_opensource_format``; ``python -m diffsynth.lora convert --to`` writes each). Restated because
# ``lora.formats`` imports torch; ``tests/pipelines/test_families_table.py`` checks that the two agree.
LORA_LAYOUTS = ("universal", "diffusers", "kohya", "peft")
# The folders of the reference's ready-made commands inside a family's ``example_folder``.
SCRIPT_KINDS = ("lora", "full", "special")
COLUMNS = ("family", "pipeline", "releases", "layouts read", "LoRA written", "planner architectures",
           "reference scripts", "refused models")
# The terminal table wraps a layout's description at this width.
LAYOUT_WIDTH = 32


@dataclass(frozen=True)
class FamilyRow:
    """One family's line of the table.

    Attributes:
        title: ``spec.title``.
        folder: ``spec.name``, the room ``diffsynth/pipelines/<folder>/``.
        docs_page: ``spec.docs_page`` (under ``docs/en/``).
        pipeline: ``spec.pipeline``, as ``train.py`` passes it to ``cli``.
        release_ids: ``spec.model_ids``, the released repositories the family trains.
        layouts: ``spec.layouts``, the released layouts the family reads.
        lora_formats: The LoRA layouts its files are written in (:data:`LORA_LAYOUTS`).
        architectures: The planner's names of its releases (``--architecture``).
        scripts: The reference's ``.sh`` commands under ``example_folder``, by kind (:data:`SCRIPT_KINDS`), as paths
            relative to the example folder.
        refused: The repository id prefixes of the family's models the trainer refuses (``spec.refused_model_ids``).
    """

    title: str
    folder: str
    docs_page: str
    pipeline: str
    release_ids: tuple[str, ...]
    layouts: tuple[str, ...]
    lora_formats: tuple[str, ...]
    architectures: tuple[str, ...]
    scripts: dict[str, tuple[str, ...]]
    refused: tuple[str, ...]

    @property
    def script_count(self) -> int:
        return sum(len(paths) for paths in self.scripts.values())


def reference_scripts(spec: FamilySpec, repo: Path = REPO) -> dict[str, tuple[str, ...]]:
    """The ``.sh`` files under the family's ``lora/``, ``full/`` and ``special/`` example folders (at any depth),
    sorted, relative to its example folder; a kind with none (or no example folder, as in an installed wheel) is
    empty."""
    folder = repo / spec.example_folder
    return {kind: tuple(sorted(path.relative_to(folder).as_posix() for path in (folder / kind).rglob("*.sh")))
            for kind in SCRIPT_KINDS}


def family_row(spec: FamilySpec, repo: Path = REPO) -> FamilyRow:
    """The table's row of one family."""
    return FamilyRow(
        title=spec.title, folder=spec.name, docs_page=spec.docs_page, pipeline=spec.pipeline,
        release_ids=tuple(spec.model_ids),
        layouts=tuple(spec.layouts), lora_formats=LORA_LAYOUTS, architectures=tuple(spec.architectures),
        scripts=reference_scripts(spec, repo), refused=tuple(spec.refused_model_ids))


def family_rows(specs: Iterable[FamilySpec] | None = None, repo: Path = REPO) -> list[FamilyRow]:
    """A row per family, in the registry's order (None reads every registered family)."""
    return [family_row(spec, repo) for spec in (families() if specs is None else specs)]


def _script_counts(row: FamilyRow) -> list[str]:
    return [f"{len(row.scripts[kind])} {kind}" for kind in SCRIPT_KINDS]


def _text_cells(row: FamilyRow) -> list[list[str]]:
    """Each column's lines for the terminal table."""
    return [[row.title, f"({row.folder})"], [row.pipeline], list(row.release_ids) or ["-"],
            [line for layout in row.layouts for line in textwrap.wrap(layout, LAYOUT_WIDTH, break_on_hyphens=False)],
            list(row.lora_formats), list(row.architectures) or ["-"], _script_counts(row), list(row.refused) or ["-"]]


def text_table(rows: Sequence[FamilyRow]) -> str:
    """The table for a terminal: a cell holds one value a line, and rows are separated by a rule."""
    header = [[title.upper()] for title in COLUMNS]
    cells = [header, *(_text_cells(row) for row in rows)]
    widths = [max(len(line) for row in cells for line in row[column]) for column in range(len(COLUMNS))]
    rule = "  ".join("-" * width for width in widths)
    lines = []
    for index, row in enumerate(cells):
        if index:
            lines.append(rule)
        for number in range(max(len(cell) for cell in row)):
            parts = [(cell[number] if number < len(cell) else "").ljust(width) for cell, width in zip(row, widths)]
            lines.append("  ".join(parts).rstrip())
    total = sum(row.script_count for row in rows)
    lines.append(f"\n{len(rows)} families, {total} reference scripts; docs/en/<page> per family, "
                 "docs/en/Adding_a_Family.md to add one.")
    return "\n".join(lines) + "\n"


def _markdown_text(value: str) -> str:
    return value.replace("|", "\\|").replace("*", "\\*").replace("<", "&lt;")


def _code(values: Iterable[str]) -> str:
    return "<br>".join(f"`{value}`" for value in values) or "-"


def _markdown_cells(row: FamilyRow) -> list[str]:
    return [f"[{_markdown_text(row.title)}]({row.docs_page}) (`{row.folder}`)", f"`{row.pipeline}`",
            _code(row.release_ids), "<br>".join(_markdown_text(layout) for layout in row.layouts),
            ", ".join(row.lora_formats), _code(row.architectures), ", ".join(_script_counts(row)), _code(row.refused)]


def markdown_table(rows: Sequence[FamilyRow]) -> str:
    """The table in markdown, for the docs (a family links to its page, relative to ``docs/en`` or ``docs/zh``)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    lines += ["| " + " | ".join(_markdown_cells(row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def build_parser(prog: str = "diffsynth-launch families") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Print the model families this package trains, one row "
                                                            "each, from their specs (diffsynth/pipelines/<family>/).")
    parser.add_argument("--format", choices=("text", "markdown"), default="text",
                        help="text: a table for the terminal (default); markdown: the table the docs embed.")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "diffsynth-launch families") -> int:
    """Prints the families table; returns 0 (argparse exits with 2 on a bad option)."""
    args = build_parser(prog).parse_args(argv)
    rows = family_rows()
    sys.stdout.write(markdown_table(rows) if args.format == "markdown" else text_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m diffsynth.pipelines.families_table"))
