"""Typed metadata cells: CSV text and JSON values converted to what the pipeline reads, bad cells named early."""

import json

import pytest

from diffsynth.core.data import DatasetError, UnifiedDataset
from diffsynth.core.data.cells import convert_row, integer, non_negative_integer, positive_integer, real, text
from diffsynth.core.data.example_dataset import build_example_dataset

TYPES = {"seed": integer, "num_inference_steps": positive_integer, "cfg_scale": real, "rand_device": text,
         "layer_num": non_negative_integer}


def test_cells_convert_from_text_and_json_values():
    rows = [{"seed": "0", "num_inference_steps": "4", "cfg_scale": "1", "rand_device": "cpu", "prompt": "7",
             "layer_num": "0"},
            {"seed": 12.0, "num_inference_steps": 2, "cfg_scale": 2.5, "rand_device": " cuda "}]
    converted = [convert_row(row, TYPES) for row in rows]
    assert [problems for _, problems in converted] == [[], []]
    converted = [row for row, _ in converted]
    assert converted[0] == {"seed": 0, "num_inference_steps": 4, "cfg_scale": 1.0, "rand_device": "cpu",
                            "prompt": "7", "layer_num": 0}  # untyped columns stay as they are
    assert converted[1] == {"seed": 12, "num_inference_steps": 2, "cfg_scale": 2.5, "rand_device": "cuda"}
    assert type(converted[0]["seed"]) is int and type(converted[0]["cfg_scale"]) is float


@pytest.mark.parametrize(("column", "value", "fragment"), [
    ("seed", "abc", "which is not a number; the pipeline reads seed as integer (e.g. 0)"),
    ("seed", "1.5", "which is not a whole number"),
    ("seed", True, "which is not a number"),
    ("num_inference_steps", "0",
     "which must be at least 1; the pipeline reads num_inference_steps as positive integer"),
    ("cfg_scale", "nan", "which is not a finite number"),
    ("layer_num", "-1", "which must be at least 0"),
    ("rand_device", " ", "which is not a non-empty string"),
])
def test_a_bad_cell_names_its_column_and_value(column, value, fragment):
    _, problems = convert_row({"seed": "0", column: value} if column != "seed" else {column: value}, TYPES)
    assert len(problems) == 1 and problems[0].startswith(f"column {column!r} holds {value!r}, {fragment}")


def test_the_dataset_converts_typed_columns_at_construction(tmp_path):
    build_example_dataset(tmp_path, num_images=2)
    lines = (tmp_path / "metadata.csv").read_text().splitlines()
    rows = [lines[0] + ",seed"] + [f"{line},{index}" for index, line in enumerate(lines[1:])]
    (tmp_path / "metadata.csv").write_text("\n".join(rows) + "\n")
    dataset = UnifiedDataset(tmp_path, tmp_path / "metadata.csv", max_pixels=4096, column_types={"seed": integer})
    assert [dataset[index]["seed"] for index in range(2)] == [0, 1]
    (tmp_path / "metadata.csv").write_text("\n".join(rows[:2] + [rows[2].rsplit(",", 1)[0] + ",x"]) + "\n")
    with pytest.raises(DatasetError, match=r"row 2 column 'seed' holds 'x'"):
        UnifiedDataset(tmp_path, tmp_path / "metadata.csv", max_pixels=4096, column_types={"seed": integer})
    json_rows = [{"image": "image_000.png", "prompt": "a", "seed": 3}]
    (tmp_path / "metadata.json").write_text(json.dumps(json_rows))
    assert UnifiedDataset(tmp_path, tmp_path / "metadata.json", max_pixels=4096,
                          column_types={"seed": integer})[0]["seed"] == 3
