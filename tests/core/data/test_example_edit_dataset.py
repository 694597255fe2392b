"""The example edit dataset: both metadata formats describe the same edits, which UnifiedDataset loads."""

import json

import numpy as np
import pytest
from PIL import Image

from diffsynth.core.data import DatasetError, UnifiedDataset
from diffsynth.core.data.example_edit_dataset import build_example_edit_dataset, main


@pytest.mark.parametrize("num_edit_images", [1, 2])
def test_csv_and_json_hold_the_same_edits(tmp_path, num_edit_images):
    metadata = build_example_edit_dataset(tmp_path, num_samples=3, num_edit_images=num_edit_images)
    rows = json.loads(metadata.read_text())
    assert len(rows) == 3 and set(rows[0]) == {"image", "edit_image", "prompt"}
    keys = ("image", "edit_image")
    from_json = UnifiedDataset(tmp_path, metadata, data_file_keys=keys)
    from_csv = UnifiedDataset(tmp_path, tmp_path / "metadata.csv", data_file_keys=keys)
    for index in range(3):
        first, second = from_json[index], from_csv[index]
        assert first["prompt"] == second["prompt"]
        edits = first["edit_image"] if num_edit_images == 2 else [first["edit_image"]]
        assert len(edits) == num_edit_images
        assert [np.asarray(i).tolist() for i in edits] == [np.asarray(i).tolist() for i in (
            second["edit_image"] if num_edit_images == 2 else [second["edit_image"]])]


def test_the_target_differs_from_the_edit_image_only_in_the_shapes_colour(tmp_path):
    metadata = build_example_edit_dataset(tmp_path, num_samples=2, num_edit_images=2, seed=4)
    row = json.loads(metadata.read_text())[0]
    target = np.asarray(Image.open(tmp_path / row["image"]), dtype=np.int16)
    source = np.asarray(Image.open(tmp_path / row["edit_image"][0]), dtype=np.int16)
    swatch = np.asarray(Image.open(tmp_path / row["edit_image"][1]))
    changed = np.abs(target - source).sum(axis=2) > 0
    assert 0 < changed.mean() < 0.5  # the shape, not the background
    assert (target[changed] == swatch[0, 0]).all()  # recoloured with the swatch's colour
    assert "picture 1" in row["prompt"] and "picture 2" in row["prompt"]


def test_the_same_seed_writes_the_same_files(tmp_path):
    first = build_example_edit_dataset(tmp_path / "a", num_samples=2, seed=1)
    second = build_example_edit_dataset(tmp_path / "b", num_samples=2, seed=1)
    for path in sorted(first.parent.iterdir()):
        assert path.read_bytes() == (second.parent / path.name).read_bytes(), path.name


@pytest.mark.parametrize(("kwargs", "fragment"), [({"num_samples": 0}, "--num_samples"),
                                                  ({"num_edit_images": 3}, "--num_edit_images")])
def test_bad_counts_are_named(tmp_path, kwargs, fragment):
    with pytest.raises(DatasetError, match=fragment):
        build_example_edit_dataset(tmp_path, **kwargs)


def test_cli_prints_the_training_flags(tmp_path, capsys):
    assert main(["--output", str(tmp_path), "--num_samples", "1", "--num_edit_images", "2"]) == 0
    assert "--data_file_keys image,edit_image --extra_inputs edit_image" in capsys.readouterr().out
    assert (tmp_path / "metadata.csv").read_text().splitlines()[1].count(",") == 3
