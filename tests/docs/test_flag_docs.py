"""The flag reference in the training docs is the parser's own table, so the docs cannot drift from the flags."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from diffsynth.diffusion.parsers import build_parser, flag_table

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "update_flag_docs.py"


def load_script():
    spec = importlib.util.spec_from_file_location("update_flag_docs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


UPDATE = load_script()


@pytest.mark.parametrize("page", UPDATE.PAGES, ids=lambda page: f"{page.parent.name}/{page.name}")
def test_flag_reference_is_current(page):
    embedded = UPDATE.embedded_table(page.read_text(encoding="utf-8"), page)
    assert embedded == flag_table(build_parser()), (
        f"the flag reference in {page} is out of date; run: .venv/bin/python scripts/update_flag_docs.py"
    )


def test_update_rewrites_only_the_block(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"# Title\n\nbefore\n\n{UPDATE.BEGIN}\n| stale |\n{UPDATE.END}\n\nafter\n", encoding="utf-8")
    table = flag_table(build_parser())
    assert UPDATE.update_page(page, table, check=True)
    assert "| stale |" in page.read_text(encoding="utf-8")  # --check leaves the page alone
    assert UPDATE.update_page(page, table)
    text = page.read_text(encoding="utf-8")
    assert text.startswith("# Title\n\nbefore\n\n") and text.endswith(f"{UPDATE.END}\n\nafter\n")
    assert UPDATE.embedded_table(text, page) == table
    assert not UPDATE.update_page(page, table)


def test_missing_markers_are_reported(tmp_path):
    page = tmp_path / "page.md"
    with pytest.raises(ValueError, match="flags:begin"):
        UPDATE.embedded_table("# no block here\n", page)
