"""The model families table in the training docs is the registry's own (``diffsynth-launch families --format
markdown``), so the docs cannot drift from the families' specs."""

from __future__ import annotations

import pytest

from diffsynth.pipelines.families_table import family_rows, markdown_table
from tests.conftest import load_script

UPDATE = load_script("scripts/update_family_docs.py", "update_family_docs")


@pytest.mark.parametrize("page", UPDATE.PAGES, ids=lambda page: f"{page.parent.name}/{page.name}")
def test_the_families_table_is_current(page):
    assert UPDATE.embedded_table(page.read_text(encoding="utf-8"), page) == markdown_table(family_rows()), (
        f"the families table in {page} is out of date; run: .venv/bin/python scripts/update_family_docs.py")


@pytest.mark.parametrize("page", UPDATE.PAGES, ids=lambda page: f"{page.parent.name}/{page.name}")
def test_every_family_page_the_table_links_exists(page):
    for row in family_rows():
        assert (page.parent / row.docs_page).is_file(), f"{page} links {row.docs_page}, which {page.parent} lacks"


def test_update_rewrites_only_the_block(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"# Title\n\nbefore\n\n{UPDATE.BEGIN}\n| stale |\n{UPDATE.END}\n\nafter\n", encoding="utf-8")
    assert UPDATE.update_page(page, check=True)
    assert "| stale |" in page.read_text(encoding="utf-8")  # --check leaves the page alone
    assert UPDATE.update_page(page)
    text = page.read_text(encoding="utf-8")
    assert text.startswith("# Title\n\nbefore\n\n") and text.endswith(f"{UPDATE.END}\n\nafter\n")
    assert UPDATE.embedded_table(text, page) == markdown_table(family_rows())
    assert not UPDATE.update_page(page)


def test_missing_markers_are_reported(tmp_path):
    with pytest.raises(ValueError, match="families:begin"):
        UPDATE.embedded_table("# no block here\n", tmp_path / "page.md")
