"""The flag references in the training docs are the parsers' own tables, so the docs cannot drift from the flags."""

from __future__ import annotations

import pytest

from diffsynth.training.config.flag_docs import flag_table
from diffsynth.training.config.parsers import build_parser
from tests.conftest import load_script

UPDATE = load_script("scripts/update_flag_docs.py", "update_flag_docs")


@pytest.mark.parametrize("page", UPDATE.PAGES, ids=lambda page: f"{page.parent.name}/{page.name}")
def test_flag_references_are_current(page):
    text = page.read_text(encoding="utf-8")
    for (begin, end), table in UPDATE.current_tables().items():
        assert UPDATE.embedded_table(text, page, begin, end) == table, (
            f"the table between {begin} and {end} in {page} is out of date; run: .venv/bin/python "
            "scripts/update_flag_docs.py"
        )


def test_update_rewrites_only_the_blocks(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"# Title\n\nbefore\n\n{UPDATE.BEGIN}\n| stale |\n{UPDATE.END}\n\nbetween\n\n"
                    f"{UPDATE.REFERENCE_BEGIN}\n| stale too |\n{UPDATE.REFERENCE_END}\n\nafter\n", encoding="utf-8")
    tables = UPDATE.current_tables()
    assert UPDATE.update_page(page, tables, check=True)
    assert "| stale |" in page.read_text(encoding="utf-8")  # --check leaves the page alone
    assert UPDATE.update_page(page, tables)
    text = page.read_text(encoding="utf-8")
    assert text.startswith("# Title\n\nbefore\n\n") and text.endswith(f"{UPDATE.REFERENCE_END}\n\nafter\n")
    assert f"{UPDATE.END}\n\nbetween\n\n{UPDATE.REFERENCE_BEGIN}" in text
    assert UPDATE.embedded_table(text, page) == flag_table(build_parser())
    assert not UPDATE.update_page(page, tables)


def test_missing_markers_are_reported(tmp_path):
    page = tmp_path / "page.md"
    with pytest.raises(ValueError, match="flags:begin"):
        UPDATE.embedded_table("# no block here\n", page)
