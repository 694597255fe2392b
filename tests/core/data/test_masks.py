"""Mask files against their rows' images and videos, and the optional mask column of the dataset."""

import pytest
from PIL import Image

from diffsynth.core.data import UnifiedDataset
from diffsynth.core.data.errors import DatasetError
from diffsynth.core.data.example_dataset import write_gif
from diffsynth.core.data.masks import check_masks


def write(folder, rows, header="image,mask,prompt"):
    (folder / "metadata.csv").write_text(header + "\n" + "\n".join(rows) + "\n")


def dataset(folder, keys=("image", "mask"), **options):
    return UnifiedDataset(folder, folder / "metadata.csv", data_file_keys=keys, optional_file_keys=("mask",),
                          **options)


@pytest.fixture
def folder(tmp_path):
    Image.new("RGB", (80, 48), "red").save(tmp_path / "wide.png")
    Image.new("L", (80, 48), 255).save(tmp_path / "wide_mask.png")
    Image.new("L", (48, 80), 255).save(tmp_path / "tall_mask.png")
    return tmp_path


def test_a_mask_of_its_image_size_passes_and_a_row_may_leave_it_empty(folder):
    write(folder, ["wide.png,wide_mask.png,a", "wide.png,,b"])
    data = dataset(folder)
    assert check_masks(data, "mask", ("image", "video")) == 1
    assert data[0]["mask"].size == data[0]["image"].size and "mask" not in data[1]
    # The mask takes no part in batching: it has its image's shape, and a row without one batches with the rest.
    assert data.bucket_key(0) == data.bucket_key(1)


def test_an_empty_mask_cell_is_refused_unless_the_column_is_optional(folder):
    write(folder, ["wide.png,,b"])
    with pytest.raises(DatasetError, match="row 1 column 'mask'"):
        UnifiedDataset(folder, folder / "metadata.csv", data_file_keys=("image", "mask"))


def test_a_mask_of_another_size_names_the_row_and_both_files(folder):
    write(folder, ["wide.png,wide_mask.png,a", "wide.png,tall_mask.png,b"])
    with pytest.raises(DatasetError) as error:
        check_masks(dataset(folder), "mask", ("image", "video"))
    message = str(error.value)
    assert "row 2 column 'mask'" in message and "tall_mask.png is 48x80" in message and "wide.png is 80x48" in message
    assert "row 1" not in message


def test_missing_and_unreadable_masks_are_named_with_their_rows(folder):
    (folder / "broken.png").write_bytes(b"not a png")
    write(folder, ["wide.png,gone.png,a", "wide.png,broken.png,b"])
    with pytest.raises(DatasetError) as error:
        dataset(folder)
    message = str(error.value)
    assert "row 1 column 'mask'" in message and "gone.png does not exist" in message
    assert "row 2 column 'mask'" in message and "broken.png is not an image" in message


def test_a_row_with_a_mask_but_nothing_to_mask_is_refused(folder):
    write(folder, ["wide_mask.png,a"], header="mask,prompt")
    with pytest.raises(DatasetError, match="no image or video to mask"):
        check_masks(dataset(folder, keys=("mask",), required_columns=()), "mask", ("image", "video"))


def video_folder(folder, mask_frames):
    frames = [Image.new("RGB", (64, 32), (index * 40, 0, 0)) for index in range(5)]
    write_gif(folder / "clip.gif", frames)
    write_gif(folder / "clip_mask.gif", [Image.new("L", (64, 32), index * 50) for index in range(mask_frames)])
    Image.new("L", (64, 32), 255).save(folder / "still_mask.png")
    Image.new("L", (32, 32), 255).save(folder / "square_mask.png")
    return folder


def test_a_video_takes_a_mask_video_of_its_frames_or_one_mask_image(tmp_path):
    folder = video_folder(tmp_path, mask_frames=5)
    write(folder, ["clip.gif,clip_mask.gif,a", "clip.gif,still_mask.png,b"], header="video,mask,prompt")
    data = dataset(folder, keys=("video", "mask"), num_frames=5)
    assert check_masks(data, "mask", ("image", "video")) == 2
    assert len(data[0]["mask"]) == 5 and data[1]["mask"].size == (64, 32)


def test_a_mask_video_of_other_frames_or_size_is_refused(tmp_path):
    folder = video_folder(tmp_path, mask_frames=3)
    write(folder, ["clip.gif,clip_mask.gif,a", "clip.gif,square_mask.png,b"], header="video,mask,prompt")
    with pytest.raises(DatasetError) as error:
        check_masks(dataset(folder, keys=("video", "mask"), num_frames=1, allow_shorter_videos=True), "mask",
                    ("image", "video"))
    message = str(error.value)
    assert "row 1 column 'mask'" not in message  # trimmed to the 1 frame asked for, both clips agree
    assert "row 2 column 'mask': square_mask.png is 32x32 pixels, but its video clip.gif is 64x32" in message
    with pytest.raises(DatasetError, match="clip_mask.gif gives 1 frames, but its video clip.gif gives 5"):
        check_masks(dataset(folder, keys=("video", "mask"), num_frames=9, allow_shorter_videos=True), "mask",
                    ("image", "video"))


def test_an_image_takes_no_mask_video(tmp_path):
    folder = video_folder(tmp_path, mask_frames=5)
    Image.new("RGB", (64, 32), "red").save(folder / "picture.png")
    write(folder, ["picture.png,clip_mask.gif,a"])
    with pytest.raises(DatasetError, match="clip_mask.gif is a video, but its row's image picture.png is an image"):
        check_masks(dataset(folder, num_frames=5), "mask", ("image", "video"))
