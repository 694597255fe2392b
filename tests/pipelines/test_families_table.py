"""The families table (``diffsynth-launch families``) is the registry's specs, one row per family, built without
importing a model library."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from diffsynth.pipelines import families_table
from diffsynth.pipelines.families_table import (
    COLUMNS,
    LORA_LAYOUTS,
    SCRIPT_KINDS,
    family_row,
    family_rows,
    markdown_table,
    text_table,
)
from diffsynth.pipelines.registry import FamilySpec, LoraTools, Release, families

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "diffusers", "transformers", "accelerate", "peft", "safetensors")


def test_one_row_per_registered_family_with_the_specs_values():
    rows = family_rows()
    assert [row.folder for row in rows] == [spec.name for spec in families()] and len(rows) >= 5
    for row, spec in zip(rows, families()):
        assert (row.title, row.pipeline, row.docs_page) == (spec.title, spec.pipeline, spec.docs_page)
        assert row.release_ids == spec.model_ids and len(row.release_ids) >= len(spec.releases)
        assert row.architectures == tuple(release.architecture for release in spec.releases)
        assert row.layouts == spec.layouts and row.refused == tuple(spec.refused_model_ids)
        assert row.lora_formats == LORA_LAYOUTS


def test_the_reference_scripts_are_the_sh_files_of_each_example_folder():
    for row, spec in zip(family_rows(), families()):
        folder = REPO / spec.example_folder
        assert (folder / "train.py").is_file()
        found = sorted(path.relative_to(folder).as_posix()
                       for kind in SCRIPT_KINDS for path in (folder / kind).rglob("*.sh"))
        assert sorted(path for kind in SCRIPT_KINDS for path in row.scripts[kind]) == found
        assert all(path.startswith(f"{kind}/") for kind in SCRIPT_KINDS for path in row.scripts[kind])
        assert row.scripts["lora"] and row.scripts["full"], spec.name  # every family runs the reference's both kinds


def test_a_family_without_examples_or_releases_gets_empty_cells(tmp_path):
    spec = FamilySpec(name="toy", title="Toy", pipeline="diffsynth.pipelines.toy:ToyPipeline", plan_name="toy",
                      denoiser_class="ToyTransformer", planner_inputs="diffsynth.pipelines.toy.planning:inputs",
                      lora_tools=LoraTools("ToyLoraLoaderMixin"), example_folder="examples/toy/model_training",
                      docs_page="Toy.md")
    row = family_row(spec, tmp_path)
    assert row.scripts == {"lora": (), "full": (), "special": ()} and row.release_ids == () and row.refused == ()
    (tmp_path / "examples/toy/model_training/special/fp8").mkdir(parents=True)
    (tmp_path / "examples/toy/model_training/special/fp8/Toy.sh").write_text("")
    released = replace(spec, model_ids=("Toy/Toy-1B", "Toy/Toy-1B-*"),
                       releases=(Release("toy-1b", {}, ("Toy/Toy-1B", "Toy/Toy-1B-*")),),
                       refused_model_ids={"Toy/Bad-": "no"})
    row = family_row(released, tmp_path)
    assert row.scripts["special"] == ("special/fp8/Toy.sh",) and row.script_count == 1
    assert row.release_ids == ("Toy/Toy-1B", "Toy/Toy-1B-*") and row.architectures == ("toy-1b",)
    assert row.refused == ("Toy/Bad-",)
    table = markdown_table([row])
    assert "`Toy/Toy-1B-*`" in table and "| 0 lora, 0 full, 1 special |" in table and "[Toy](Toy.md) (`toy`)" in table


def test_the_lora_layouts_are_the_lora_packages():
    from diffsynth.lora.formats import LAYOUTS

    assert LORA_LAYOUTS == LAYOUTS


def test_the_text_table_shows_every_value_of_every_row():
    rows = family_rows()
    table = text_table(rows)
    header, rule = table.splitlines()[:2]
    assert header.split("  ")[0] == "FAMILY" and set(rule) == {"-", " "}
    words = set(table.split())
    for row in rows:
        values = (row.title.split()[0], f"({row.folder})", row.pipeline, *row.release_ids, *row.architectures,
                  *row.refused, *row.lora_formats)
        assert all(value in words for value in values), row.folder
        assert all(word in words for layout in row.layouts for word in layout.split())
    assert table.rstrip().endswith(f"{sum(row.script_count for row in rows)} reference scripts; docs/en/<page> per "
                                   "family, docs/en/Adding_a_Family.md to add one.")


def test_the_markdown_table_has_a_line_per_family_and_a_cell_per_column():
    rows = family_rows()
    lines = markdown_table(rows).splitlines()
    assert len(lines) == 2 + len(rows)
    assert lines[0] == "| " + " | ".join(COLUMNS) + " |"
    for line, row in zip(lines[2:], rows):
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        assert len(cells) == len(COLUMNS)
        assert cells[0] == f"[{row.title}]({row.docs_page}) (`{row.folder}`)" and cells[1] == f"`{row.pipeline}`"
        assert cells[2] == "<br>".join(f"`{model_id}`" for model_id in row.release_ids)
        assert cells[6] == ", ".join(f"{len(row.scripts[kind])} {kind}" for kind in SCRIPT_KINDS)


@pytest.mark.parametrize("form", ["text", "markdown"])
def test_printing_the_table_imports_no_model_library(form):
    code = ("import json, sys; from diffsynth.pipelines.families_table import main; "
            f"code = main(['--format', '{form}']); "
            f"print(json.dumps([code, sorted(m for m in {HEAVY!r} if m in sys.modules)]))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    *table, last = done.stdout.splitlines()
    assert json.loads(last) == [0, []]
    rows = family_rows()
    expected = markdown_table(rows) if form == "markdown" else text_table(rows)
    assert "\n".join(table) + "\n" == expected


def test_a_bad_option_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        families_table.main(["--format", "html"])
    assert exit_info.value.code == 2 and "invalid choice: 'html'" in capsys.readouterr().err
