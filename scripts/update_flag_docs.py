"""Regenerates the flag references in the training docs from the trainer's parsers.

    python scripts/update_flag_docs.py           # rewrite the blocks in every page that embeds them
    python scripts/update_flag_docs.py --check   # only report stale pages; exit status 1 if there are any

Each page holds two generated blocks, each between its two marker comments below: the trainer's flags
(``flag_table(build_parser())``) and the reference trainer's flags with their status here (``reference_flag_table``).
The text around them is left as it is. ``tests/docs/test_flag_docs.py`` fails while a page is stale.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from diffsynth.training.config.flag_docs import flag_table, reference_flag_table
from diffsynth.training.config.parsers import build_parser

REPO = Path(__file__).resolve().parents[1]
PAGES = (REPO / "docs" / "en" / "Training.md", REPO / "docs" / "zh" / "Training.md")
BEGIN = "<!-- flags:begin -->"
END = "<!-- flags:end -->"
REFERENCE_BEGIN = "<!-- reference-flags:begin -->"
REFERENCE_END = "<!-- reference-flags:end -->"


def current_tables() -> dict[tuple[str, str], str]:
    """Each generated block as the code defines it now, by its markers."""
    return {(BEGIN, END): flag_table(build_parser()),
            (REFERENCE_BEGIN, REFERENCE_END): reference_flag_table([build_parser(), build_parser(video=True)])}


def _block_bounds(text: str, page: Path, begin: str = BEGIN, end: str = END) -> tuple[int, int]:
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"{page} must hold one {begin} line followed by one {end} line around a generated table")
    return text.index(begin) + len(begin), text.index(end)


def embedded_table(text: str, page: Path, begin: str = BEGIN, end: str = END) -> str:
    """The table a page embeds between the markers (blank lines around it removed)."""
    start, stop = _block_bounds(text, page, begin, end)
    return text[start:stop].strip("\n") + "\n"


def with_table(text: str, table: str, page: Path, begin: str = BEGIN, end: str = END) -> str:
    """``text`` with the block between the markers replaced by ``table``."""
    start, stop = _block_bounds(text, page, begin, end)
    return f"{text[:start]}\n\n{table.strip(chr(10))}\n\n{text[stop:]}"


def update_page(page: Path, tables: dict[tuple[str, str], str], check: bool = False) -> bool:
    """Brings one page's blocks up to date (unless ``check``); returns whether it was stale."""
    text = page.read_text(encoding="utf-8")
    updated = text
    for (begin, end), table in tables.items():
        if embedded_table(updated, page, begin, end) != table:
            updated = with_table(updated, table, page, begin, end)
    if updated == text:
        return False
    if not check:
        page.write_text(updated, encoding="utf-8")
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report stale pages without rewriting them")
    args = parser.parse_args(argv)
    tables = current_tables()
    stale = [page for page in PAGES if update_page(page, tables, check=args.check)]
    for page in stale:
        print(f"{page.relative_to(REPO)}: {'out of date' if args.check else 'updated'}")
    if not stale:
        print("flag reference up to date")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
