"""Regenerates the flag reference in the training docs from the trainer's parser.

    python scripts/update_flag_docs.py           # rewrite the block in every page that embeds it
    python scripts/update_flag_docs.py --check   # only report stale pages; exit status 1 if there are any

Each page holds the output of ``flag_table(build_parser())`` between the two marker comments below; the text
around them is left as it is. ``tests/docs/test_flag_docs.py`` fails while a page is stale.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from diffsynth.diffusion.parsers import build_parser, flag_table

REPO = Path(__file__).resolve().parents[1]
PAGES = (REPO / "docs" / "en" / "Training.md", REPO / "docs" / "zh" / "Training.md")
BEGIN = "<!-- flags:begin -->"
END = "<!-- flags:end -->"


def current_table() -> str:
    """The flag reference as the code defines it now."""
    return flag_table(build_parser())


def _block_bounds(text: str, page: Path) -> tuple[int, int]:
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"{page} must hold one {BEGIN} line followed by one {END} line around the flag reference")
    return text.index(BEGIN) + len(BEGIN), text.index(END)


def embedded_table(text: str, page: Path) -> str:
    """The table a page embeds between the markers (blank lines around it removed)."""
    start, end = _block_bounds(text, page)
    return text[start:end].strip("\n") + "\n"


def with_table(text: str, table: str, page: Path) -> str:
    """``text`` with the block between the markers replaced by ``table``."""
    start, end = _block_bounds(text, page)
    return f"{text[:start]}\n\n{table.strip(chr(10))}\n\n{text[end:]}"


def update_page(page: Path, table: str, check: bool = False) -> bool:
    """Brings one page's block up to date (unless ``check``); returns whether it was stale."""
    text = page.read_text(encoding="utf-8")
    if embedded_table(text, page) == table:
        return False
    if not check:
        page.write_text(with_table(text, table, page), encoding="utf-8")
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report stale pages without rewriting them")
    args = parser.parse_args(argv)
    table = current_table()
    stale = [page for page in PAGES if update_page(page, table, check=args.check)]
    for page in stale:
        print(f"{page.relative_to(REPO)}: {'out of date' if args.check else 'updated'}")
    if not stale:
        print("flag reference up to date")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
