"""Files whose body is damaged: found by a full decode, then fatal or skipped, the same way in every process."""

import pickle

import av
import numpy as np
import pytest
from PIL import Image
from torch.utils.data import DataLoader

from diffsynth.core.data import BadSampleError, DatasetError, UnifiedDataset
from diffsynth.core.data.bad_samples import SKIPPED_KEY, bad_samples_error, pop_skipped


def truncated_png(path):
    Image.effect_noise((128, 128), 64).convert("RGB").save(path)
    path.write_bytes(path.read_bytes()[:400])


@pytest.fixture
def folder(tmp_path):
    """Four rows; row 3 (index 2) names a PNG whose body is cut off after 400 bytes."""
    for name, colour in (("a.png", "red"), ("b.png", "green"), ("d.png", "blue")):
        Image.new("RGB", (64, 64), colour).save(tmp_path / name)
    truncated_png(tmp_path / "c.png")
    rows = ["image,prompt", "a.png,red", "b.png,green", "c.png,noise", "d.png,blue"]
    (tmp_path / "metadata.csv").write_text("\n".join(rows) + "\n")
    return tmp_path


def build(folder, **kwargs):
    return UnifiedDataset(folder, folder / "metadata.csv", **kwargs)


def test_the_header_check_passes_and_a_full_decode_names_row_column_and_file(folder):
    dataset = build(folder)
    assert dataset.decode_pixels == 3 * 64 * 64 + 128 * 128
    (bad,) = dataset.find_bad_rows(range(4))
    assert (bad.index, bad.column, bad.path) == (2, "image", "c.png")
    assert bad.describe().startswith("row 3 (column 'image': c.png): could not decode image")
    error = bad_samples_error([bad], "data/metadata.csv")
    assert "row 3" in str(error) and "c.png" in str(error) and "--on_bad_sample skip" in str(error)


def test_stop_raises_on_first_touch_naming_the_row(folder):
    dataset = build(folder)
    with pytest.raises(BadSampleError) as error:
        dataset[2]
    assert "row 3" in str(error.value) and "c.png" in str(error.value) and "--on_bad_sample skip" in str(error.value)
    assert error.value.bad.index == 2
    assert pickle.loads(pickle.dumps(error.value)).bad == error.value.bad  # re-raised from dataloader workers


def test_skip_in_training_replaces_the_sample_with_the_next_readable_row(folder):
    dataset = build(folder, on_bad_sample="skip", repeat=2)
    assert len(dataset) == 8
    sample = dataset[2]
    assert sample["prompt"] == "blue" and [bad.index for bad in pop_skipped(sample)] == [2]
    assert SKIPPED_KEY not in dataset[3] and pop_skipped(dataset[3]) == []
    assert dataset[6]["prompt"] == "blue"  # the repeat of row 3


def test_rows_found_bad_at_start_up_leave_the_epoch(folder):
    dataset = build(folder, on_bad_sample="skip")
    dataset.exclude(dataset.find_bad_rows(range(4)))
    assert len(dataset) == 3 and [dataset[index]["prompt"] for index in range(3)] == ["red", "green", "blue"]


def test_stage_one_keeps_row_indices_and_marks_the_bad_rows(folder):
    dataset = build(folder, on_bad_sample="skip", keep_row_indices=True)
    assert len(dataset) == 4
    assert [bad.index for bad in dataset[2][SKIPPED_KEY]] == [2] and set(dataset[2]) == {SKIPPED_KEY}
    dataset.exclude(dataset.find_bad_rows(range(4)))
    assert len(dataset) == 4 and set(dataset[2]) == {SKIPPED_KEY} and dataset[3]["prompt"] == "blue"


def test_the_marker_survives_a_dataloader_worker(folder):
    loader = DataLoader(build(folder, on_bad_sample="skip"), batch_size=1, collate_fn=lambda batch: batch[0],
                        num_workers=1)
    samples = list(loader)
    assert [sample["prompt"] for sample in samples] == ["red", "green", "blue", "blue"]
    assert [[bad.path for bad in pop_skipped(sample)] for sample in samples] == [[], [], ["c.png"], []]


def test_a_dataset_with_no_readable_row_says_so(tmp_path):
    truncated_png(tmp_path / "x.png")
    (tmp_path / "metadata.csv").write_text("image,prompt\nx.png,noise\n")
    dataset = build(tmp_path, on_bad_sample="skip")
    with pytest.raises(DatasetError, match="no row of metadata"):
        dataset[0]
    with pytest.raises(DatasetError, match="no row of metadata"):
        dataset.exclude(dataset.find_bad_rows([0]))


def test_on_bad_sample_is_checked():
    with pytest.raises(DatasetError, match="--on_bad_sample 'ignore'"):
        UnifiedDataset("nowhere", "nowhere/metadata.csv", on_bad_sample="ignore")


def test_a_video_with_a_truncated_body_is_found_by_the_full_decode(tmp_path):
    # mp4 with its index first (faststart): the header promises 9 frames, the cut file holds fewer.
    path = tmp_path / "clip.mp4"
    with av.open(str(path), "w", options={"movflags": "faststart"}) as container:
        stream = container.add_stream("mpeg4", rate=8)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        generator = np.random.default_rng(0)
        for _ in range(9):
            pixels = (generator.random((64, 96, 3)) * 255).astype(np.uint8)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        container.mux(stream.encode())
    whole = path.read_bytes()
    (tmp_path / "cut.mp4").write_bytes(whole[: len(whole) * 6 // 10])
    (tmp_path / "metadata.csv").write_text("video,prompt\nclip.mp4,whole\ncut.mp4,cut\n")
    dataset = build(tmp_path, num_frames=9)
    assert dataset.decode_pixels == 2 * 9 * 96 * 64
    (bad,) = dataset.find_bad_rows(range(2))
    assert (bad.index, bad.column, bad.path) == (1, "video", "cut.mp4") and "truncated" in bad.reason
