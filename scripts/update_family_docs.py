"""Regenerates the model families table in the training docs from the families' specs.

    python scripts/update_family_docs.py           # rewrite the block in every page that embeds it
    python scripts/update_family_docs.py --check   # only report stale pages; exit status 1 if there are any

Each page holds the table (``markdown_table(family_rows())`` of ``diffsynth.pipelines.families_table``, what
``diffsynth-launch families --format markdown`` prints) between the two marker comments below; the text around it is
left as it is. The block handling is ``update_flag_docs.py``'s. ``tests/docs/test_family_docs.py`` fails while a page
is stale.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

from diffsynth.pipelines.families_table import family_rows, markdown_table

REPO = Path(__file__).resolve().parents[1]
PAGES = (REPO / "docs" / "en" / "Training.md", REPO / "docs" / "zh" / "Training.md")
BEGIN = "<!-- families:begin -->"
END = "<!-- families:end -->"


def _flag_docs_script():
    spec = importlib.util.spec_from_file_location("update_flag_docs", Path(__file__).resolve().parent /
                                                  "update_flag_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FLAG_DOCS = _flag_docs_script()


def current_tables() -> dict[tuple[str, str], str]:
    """The generated block as the registry defines it now, by its markers."""
    return {(BEGIN, END): markdown_table(family_rows())}


def embedded_table(text: str, page: Path) -> str:
    """The table a page embeds between the markers (blank lines around it removed)."""
    return FLAG_DOCS.embedded_table(text, page, BEGIN, END)


def update_page(page: Path, check: bool = False) -> bool:
    """Brings one page's block up to date (unless ``check``); returns whether it was stale."""
    return FLAG_DOCS.update_page(page, current_tables(), check=check)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report stale pages without rewriting them")
    args = parser.parse_args(argv)
    stale = [page for page in PAGES if update_page(page, check=args.check)]
    for page in stale:
        print(f"{page.relative_to(REPO)}: {'out of date' if args.check else 'updated'}")
    if not stale:
        print("families table up to date")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
