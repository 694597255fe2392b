"""The example dataset: deterministic, varied in shape, captioned truthfully, and loadable by UnifiedDataset."""

import csv
import re
import runpy
import sys
from pathlib import Path

import pytest
from PIL import Image

from diffsynth.core.data import DatasetError, UnifiedDataset
from diffsynth.core.data.example_dataset import COLOURS, MAX_SIDE, MIN_SIDE, PLACES, build_example_dataset, main

REPO = Path(__file__).resolve().parents[3]


def read_rows(metadata):
    with open(metadata, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_writes_images_and_metadata(tmp_path):
    metadata = build_example_dataset(tmp_path, num_images=6)
    assert metadata == tmp_path / "metadata.csv"
    rows = read_rows(metadata)
    assert len(rows) == 6 and list(rows[0]) == ["image", "prompt"]
    sizes = [Image.open(tmp_path / row["image"]).size for row in rows]
    assert all(MIN_SIDE <= side <= MAX_SIDE for size in sizes for side in size)
    assert {(width > height) - (width < height) for width, height in sizes} == {1, -1, 0}
    assert any(side % 16 for size in sizes for side in size), "some sides must need rounding to 16"
    assert len({row["prompt"] for row in rows}) == 6
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([row["image"] for row in rows] + ["metadata.csv"])


def test_same_seed_same_files_other_seed_other_files(tmp_path):
    first, second, other = (build_example_dataset(tmp_path / name, num_images=3, seed=seed).parent
                            for name, seed in (("a", 7), ("b", 7), ("c", 8)))
    files = sorted(path.name for path in first.iterdir())
    assert files == sorted(path.name for path in second.iterdir())
    assert all((first / name).read_bytes() == (second / name).read_bytes() for name in files)
    assert (first / "metadata.csv").read_text() != (other / "metadata.csv").read_text()


def test_captions_describe_the_drawn_shape(tmp_path):
    metadata = build_example_dataset(tmp_path, num_images=12, seed=3)
    pattern = re.compile(r"an? (\w+) (\w+) (" + "|".join(PLACES) + r") of an? (\w+) to (\w+) gradient running "
                         r"(top to bottom|left to right)")
    checked = 0
    for row in read_rows(metadata):
        fill, shape, place, start, end, direction = pattern.fullmatch(row["prompt"]).groups()
        image = Image.open(tmp_path / row["image"]).convert("RGB")
        width, height = image.size
        corner = (width - 1, height - 1) if direction == "top to bottom" else (width - 1, 0)
        assert max(abs(a - b) for a, b in zip(image.getpixel(corner), COLOURS[end], strict=True)) <= 3, row
        if shape != "ring":  # a ring's centre shows the background
            centre = ((PLACES.index(place) * 2 + 1) * width // 6, height // 2)
            assert image.getpixel(centre) == COLOURS[fill], row
            checked += 1
    assert checked > 0


def test_unified_dataset_loads_it(tmp_path):
    metadata = build_example_dataset(tmp_path, num_images=3)
    dataset = UnifiedDataset(tmp_path, metadata, max_pixels=128 * 128)
    for index in range(3):
        sample = dataset[index]
        width, height = sample["image"].size
        assert width % 16 == 0 and height % 16 == 0 and width * height <= 128 * 128
        assert sample["prompt"] == dataset.rows[index]["prompt"]


@pytest.mark.parametrize("num_images", [0, -2, 1.5])
def test_bad_image_count(tmp_path, num_images):
    with pytest.raises(DatasetError, match="--num_images"):
        build_example_dataset(tmp_path, num_images=num_images)


def test_command_line(tmp_path, capsys):
    assert main(["--output", str(tmp_path / "out"), "--num_images", "2", "--seed", "1"]) == 0
    printed = capsys.readouterr().out
    assert str(tmp_path / "out") in printed and "--dataset_metadata_path" in printed
    assert len(read_rows(tmp_path / "out" / "metadata.csv")) == 2


def test_script_wrapper(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["build_example_dataset.py", "--output", str(tmp_path), "--num_images", "1"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(REPO / "scripts" / "build_example_dataset.py"), run_name="__main__")
    assert exit_info.value.code == 0
    assert (tmp_path / "image_000.png").is_file()
