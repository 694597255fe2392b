"""UnifiedDataset: the three metadata formats, repeat, sizing, and every construction-time error."""

import csv
import json
import pickle

import pytest
from PIL import Image

from diffsynth.core.data import (FILE_OPERATORS, DataFileNotFoundError, DatasetError, FileOperator, UnifiedDataset,
                                 check_dataset, read_metadata)
from diffsynth.core.data.errors import MissingColumnsError

ROWS = [
    {"image": "a.png", "prompt": "a red square", "style": "flat"},
    {"image": "sub/b.jpg", "prompt": "a green, wide field", "style": ""},
    {"image": "c.png", "prompt": "ünïcödé caption", "style": "photo"},
]
SIZES = {"a.png": (64, 64), "sub/b.jpg": (200, 100), "c.png": (90, 170)}


def write_metadata(path, rows, columns=None):
    """Writes ``rows`` as CSV, JSON or JSONL by the extension of ``path``."""
    if path.suffix == ".csv":
        columns = columns or list(rows[0])
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, columns)
            writer.writeheader()
            writer.writerows(rows)
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows), encoding="utf-8")
    else:
        path.write_text("\n".join(json.dumps(row) for row in rows) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def folder(tmp_path):
    """A dataset folder with the images of ROWS (distinct colours) and their metadata as metadata.csv."""
    for index, (name, size) in enumerate(SIZES.items()):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", size, (80 * index, 40, 200 - 60 * index)).save(tmp_path / name)
    write_metadata(tmp_path / "metadata.csv", ROWS)
    return tmp_path


def build(folder, metadata="metadata.csv", **kwargs):
    return UnifiedDataset(folder, folder / metadata, **kwargs)


def test_items_hold_decoded_images_and_the_other_columns(folder):
    dataset = build(folder)
    assert len(dataset) == 3
    item = dataset[1]
    assert isinstance(item["image"], Image.Image) and item["image"].mode == "RGB"
    assert item["image"].size == (192, 96)
    assert item["prompt"] == "a green, wide field" and item["style"] == ""
    assert dataset[2]["prompt"] == "ünïcödé caption"
    assert dataset.rows[1]["image"] == "sub/b.jpg", "reading an item must not change the stored row"


@pytest.mark.parametrize("extension", [".json", ".jsonl"])
def test_json_and_jsonl_give_the_same_items_as_csv(folder, extension):
    write_metadata(folder / f"metadata{extension}", ROWS)
    from_csv, other = build(folder), build(folder, f"metadata{extension}")
    assert len(other) == len(from_csv)
    for index in range(len(from_csv)):
        expected, got = from_csv[index], other[index]
        assert got.keys() == expected.keys()
        assert got["prompt"] == expected["prompt"] and got["style"] == expected["style"]
        assert got["image"].tobytes() == expected["image"].tobytes()


def test_repeat_cycles_through_the_rows(folder):
    dataset = build(folder, repeat=4)
    assert len(dataset) == 12
    assert [dataset[index]["prompt"] for index in range(12)] == [row["prompt"] for row in ROWS] * 4
    assert dataset[-1]["prompt"] == ROWS[-1]["prompt"]
    with pytest.raises(IndexError):
        dataset[12]
    assert len(list(iter(dataset))) == 12, "iteration must stop at the end"


@pytest.mark.parametrize("repeat", [0, -1, 1.5, True])
def test_bad_repeat_names_the_flag(folder, repeat):
    with pytest.raises(DatasetError, match="--dataset_repeat"):
        build(folder, repeat=repeat)


def test_fixed_size_and_max_pixels_reach_the_items(folder):
    assert {build(folder, height=32, width=48)[index]["image"].size for index in range(3)} == {(48, 32)}
    small = build(folder, max_pixels=64 * 64)
    assert small[1]["image"].size == (80, 32)  # 200x100 scaled by sqrt(4096/20000) = 90.5x45.3, rounded down to 16


def test_a_size_flag_error_comes_before_reading_the_metadata(tmp_path):
    with pytest.raises(DatasetError, match="--height"):
        UnifiedDataset(tmp_path, tmp_path / "missing.csv", height=30, width=32)


def test_a_list_of_files_in_a_json_row_loads_every_file(folder):
    write_metadata(folder / "metadata.json", [{"image": ["a.png", "c.png"], "prompt": "two pictures"}])
    item = build(folder, "metadata.json")[0]
    assert [image.size for image in item["image"]] == [(64, 64), (80, 160)]


def test_a_csv_cell_naming_several_files_loads_each(folder):
    write_metadata(folder / "metadata.csv", [{"image": "a.png", "edit_image": "c.png, sub/b.jpg", "prompt": "edit"},
                                             {"image": "a.png", "edit_image": "c.png", "prompt": "one"}])
    dataset = build(folder, data_file_keys=("image", "edit_image"))
    assert [image.size for image in dataset[0]["edit_image"]] == [(80, 160), (192, 96)]
    assert isinstance(dataset[1]["edit_image"], Image.Image)
    # Only data-file columns are split: a prompt keeps its commas.
    assert build(folder, data_file_keys=("image",))[0]["edit_image"] == "c.png, sub/b.jpg"


@pytest.mark.parametrize("metadata", ["metadata.csv", "metadata.json"])
def test_a_missing_file_in_a_list_names_the_row_and_path(folder, metadata):
    write_metadata(folder / metadata, [{"image": "a.png", "edit_image": ["c.png"], "prompt": "edit"},
                                       {"image": "a.png", "edit_image": ["c.png", "gone.png"], "prompt": "edit"}]
                   if metadata.endswith(".json") else
                   [{"image": "a.png", "edit_image": "c.png", "prompt": "edit"},
                    {"image": "a.png", "edit_image": "c.png,gone.png", "prompt": "edit"}])
    with pytest.raises(DataFileNotFoundError, match=r"row 2 column 'edit_image': .*gone\.png does not exist"):
        build(folder, metadata, data_file_keys=("image", "edit_image"))


def test_a_blank_between_commas_names_the_cell(folder):
    write_metadata(folder / "metadata.csv", [{"image": "a.png", "edit_image": "c.png,,a.png", "prompt": "edit"}])
    expect_error(folder, DatasetError, ["row 1", "'edit_image'", "c.png"], data_file_keys=("image", "edit_image"))


def test_file_operators_are_looked_up_by_extension_so_new_kinds_plug_in(folder, monkeypatch):
    loaded = []

    def load(path, resize):
        loaded.append(path)
        return path.read_text()

    monkeypatch.setitem(FILE_OPERATORS, ".txt", FileOperator(kind="text", check=lambda path, resize: 6, load=load))
    (folder / "clip.txt").write_text("frames")
    write_metadata(folder / "metadata.jsonl", [{"video": "clip.txt", "prompt": "a clip"}])
    dataset = build(folder, "metadata.jsonl")
    assert dataset[0]["video"] == "frames" and dataset.decode_pixels == 6
    assert loaded == [folder / "clip.txt"]


def test_a_column_outside_data_file_keys_is_not_loaded(folder):
    assert build(folder, data_file_keys=("video",))[0]["image"] == "a.png"


def test_construction_reads_headers_only_so_a_truncated_image_fails_when_read(folder):
    path = folder / "c.png"
    Image.effect_noise((128, 128), 64).convert("RGB").save(path)
    path.write_bytes(path.read_bytes()[:400])
    dataset = build(folder)
    assert dataset[0]["image"].size == (64, 64)
    with pytest.raises(DatasetError, match="c.png"):
        dataset[2]


def test_check_dataset_checks_without_building_a_dataset(folder):
    rows = check_dataset(folder, folder / "metadata.csv").rows
    assert [row["prompt"] for row in rows] == [row["prompt"] for row in ROWS]
    (folder / "a.png").unlink()
    with pytest.raises(DataFileNotFoundError, match="a.png"):
        check_dataset(folder, folder / "metadata.csv")


def test_the_dataset_pickles_for_dataloader_workers(folder):
    dataset = pickle.loads(pickle.dumps(build(folder, repeat=2)))
    assert len(dataset) == 6 and dataset[4]["image"].size == (192, 96)


def test_csv_header_spaces_and_byte_order_mark_are_tolerated(folder):
    (folder / "metadata.csv").write_text("\ufeffimage, prompt\na.png, a cat\n", encoding="utf-8")
    rows, columns = read_metadata(folder / "metadata.csv")
    assert columns == ["image", "prompt"]
    assert rows == [{"image": "a.png", "prompt": " a cat"}]


def test_a_quoted_csv_cell_may_span_lines(folder):
    (folder / "metadata.csv").write_text('image,prompt\na.png,"line one\nline two"\n', encoding="utf-8")
    assert build(folder)[0]["prompt"] == "line one\nline two"


# Construction-time errors: each names the file, the row and the column where there is one, and the fix.

def expect_error(folder, error_type, names, metadata="metadata.csv", **kwargs):
    with pytest.raises(error_type) as error:
        build(folder, metadata, **kwargs)
    message = str(error.value)
    for name in names:
        assert name in message, f"{name!r} missing from: {message}"
    return message


def test_missing_metadata_file(folder):
    expect_error(folder, DataFileNotFoundError, ["nowhere.csv", "--dataset_metadata_path"], "nowhere.csv")


def test_missing_base_folder(tmp_path):
    with pytest.raises(DataFileNotFoundError, match="--dataset_base_path"):
        UnifiedDataset(tmp_path / "absent", tmp_path / "metadata.csv")


@pytest.mark.parametrize("name", ["metadata.txt", "metadata.parquet", "metadata"])
def test_unsupported_metadata_extension(folder, name):
    (folder / name).write_text("image,prompt\n")
    expect_error(folder, DatasetError, [name, ".csv", ".jsonl"], name)


def test_missing_required_column_names_it_and_the_columns_found(folder):
    write_metadata(folder / "metadata.csv", [{"image": "a.png", "text": "a cat"}])
    expect_error(folder, DatasetError, ["'prompt'", "'image'", "'text'", "metadata.csv"])
    # The trainer tells a video dataset given to an image model from a misnamed column by these.
    with pytest.raises(MissingColumnsError) as error:
        build(folder)
    assert (error.value.missing, error.value.found) == (["prompt"], ["image", "text"])


def test_required_columns_are_configurable(folder):
    write_metadata(folder / "metadata.csv", [{"image": "a.png", "text": "a cat"}])
    assert build(folder, required_columns=("text",))[0]["text"] == "a cat"
    expect_error(folder, DatasetError, ["'caption'"], required_columns=("text", "caption"))


@pytest.mark.parametrize("content", ["", "image,prompt\n"])
def test_a_dataset_without_rows(folder, content):
    (folder / "metadata.csv").write_text(content)
    expect_error(folder, DatasetError, ["metadata.csv", "no rows"])


@pytest.mark.parametrize("extension", [".json", ".jsonl"])
def test_an_empty_json_dataset(folder, extension):
    (folder / f"metadata{extension}").write_text("[]" if extension == ".json" else "\n")
    expect_error(folder, DatasetError, ["no rows"], f"metadata{extension}")


@pytest.mark.parametrize("prompt", ["", "   ", None])
def test_an_empty_prompt_cell_names_the_row(folder, prompt):
    rows = [dict(ROWS[0]), {**ROWS[1], "prompt": prompt}]
    write_metadata(folder / "metadata.json", rows)
    expect_error(folder, DatasetError, ["metadata.json", "row 2", "'prompt'"], "metadata.json")


@pytest.mark.parametrize("prompt", [{"k": 1}, 123, ["a cat"], True])
@pytest.mark.parametrize("extension", [".json", ".jsonl"])
def test_a_json_prompt_that_is_not_text_names_the_row_and_column(folder, extension, prompt):
    write_metadata(folder / f"metadata{extension}", [ROWS[0], {**ROWS[1], "prompt": prompt}])
    expect_error(folder, DatasetError, [f"metadata{extension} row 2 column 'prompt' holds {prompt!r}, not text"],
                 f"metadata{extension}")


def test_every_bad_row_is_named_at_once_with_the_total(folder):
    """Four rows, four different problems: one run lists them all (in row order), not only the first."""
    rows = [ROWS[0], {**ROWS[1], "prompt": ""}, {**ROWS[2], "image": "gone.png"}, {**ROWS[0], "prompt": 7},
            {**ROWS[0], "image": ""}]
    write_metadata(folder / "metadata.json", rows)
    message = expect_error(folder, DatasetError, ["metadata.json has 4 problems:"], "metadata.json")
    lines = message.splitlines()[1:5]
    assert [line.split(" ", 4)[2:4] for line in lines] == [["row", "2"], ["row", "3"], ["row", "4"], ["row", "5"]]
    assert ["'prompt'" in lines[0], "gone.png does not exist" in lines[1], "holds 7, not text" in lines[2],
            "column 'image' holds ''" in lines[3]] == [True] * 4


def test_a_long_list_of_problems_stops_at_the_cap_and_counts_the_rest(folder):
    from diffsynth.core.data.metadata import PROBLEMS_SHOWN

    write_metadata(folder / "metadata.csv", [ROWS[0], *({"image": f"gone{n}.png", "prompt": "x"} for n in range(25))])
    message = expect_error(folder, DataFileNotFoundError, ["metadata.csv has 25 problems:", "gone19.png",
                                                           f"... and {25 - PROBLEMS_SHOWN} more"])
    assert "gone20.png" not in message and len(message.splitlines()) == PROBLEMS_SHOWN + 3


def test_a_json_row_without_the_prompt_key_names_the_row(folder):
    write_metadata(folder / "metadata.jsonl", [ROWS[0], ROWS[1], {"image": "c.png"}])
    expect_error(folder, DatasetError, ["row 3", "'prompt'"], "metadata.jsonl")


def test_a_short_csv_row_names_the_row(folder):
    (folder / "metadata.csv").write_text("image,prompt\na.png,a cat\nc.png\n")
    expect_error(folder, DatasetError, ["row 2", "'prompt'"])


def test_a_long_csv_row_names_the_row_and_the_quoting_fix(folder):
    (folder / "metadata.csv").write_text("image,prompt\na.png,a cat, sitting\n")
    expect_error(folder, DatasetError, ["row 1", "more cells", "quote"])


def test_a_missing_data_file_names_the_row_column_and_path(folder):
    (folder / "sub" / "b.jpg").unlink()
    expect_error(folder, DataFileNotFoundError, ["row 2", "'image'", "sub/b.jpg", "--dataset_base_path"])


def test_an_empty_data_file_cell_names_the_row_and_column(folder):
    write_metadata(folder / "metadata.csv", [ROWS[0], {**ROWS[1], "image": ""}])
    expect_error(folder, DatasetError, ["row 2", "'image'", "--data_file_keys"])


def test_a_file_pil_cannot_identify_names_the_file_and_row(folder):
    (folder / "c.png").write_bytes(b"\x00" * 64)
    expect_error(folder, DatasetError, ["row 3", "'image'", "c.png", "not an image"])


def test_an_unsupported_extension_lists_the_supported_extensions(folder):
    (folder / "clip.flv").write_bytes(b"\x00" * 64)
    write_metadata(folder / "metadata.jsonl", [{"video": "clip.flv", "prompt": "a clip"}])
    expect_error(folder, DatasetError, ["row 1", "'video'", "clip.flv", ".png", ".mp4"], "metadata.jsonl")


def test_an_image_too_thin_for_max_pixels_fails_at_construction(folder):
    Image.new("RGB", (6, 300)).save(folder / "a.png")
    expect_error(folder, DatasetError, ["row 1", "a.png", "6x300"])


@pytest.mark.parametrize("text, names", [
    ('{"image": "a.png"}', ["JSON dict", "list of objects"]),
    ('[{"image": "a.png", "prompt": "x"}, "b.png"]', ["row 2", "JSON str"]),
    ('[{"image": "a.png",', ["not valid JSON"]),
])
def test_malformed_json(folder, text, names):
    (folder / "metadata.json").write_text(text)
    expect_error(folder, DatasetError, ["metadata.json", *names], "metadata.json")


def test_malformed_jsonl_names_the_line(folder):
    (folder / "metadata.jsonl").write_text('{"image": "a.png", "prompt": "x"}\n\n{"image": "c.png",\n')
    expect_error(folder, DatasetError, ["metadata.jsonl", "line 3"], "metadata.jsonl")


def test_non_utf8_metadata(folder):
    (folder / "metadata.csv").write_bytes("image,prompt\na.png,café\n".encode("latin-1"))
    expect_error(folder, DatasetError, ["metadata.csv", "UTF-8"])


def test_a_single_string_for_a_list_argument_is_rejected(folder):
    with pytest.raises(DatasetError, match="data_file_keys"):
        build(folder, data_file_keys="image")
