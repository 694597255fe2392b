"""UnifiedDataset with aspect-ratio buckets: images and frames load at their bucket's size, bucket keys predict what
loads from the headers alone (EXIF orientation and video rotation included), and a skipped sample is replaced within
its bucket."""

import numpy as np
from PIL import Image

from diffsynth.core.data import UnifiedDataset
from diffsynth.core.data.bad_samples import pop_skipped
from diffsynth.core.data.buckets import bucket_sizes, nearest_bucket
from tests.core.data.test_video import encode

BUDGET = 64 * 64


def write(folder, rows, column="image"):
    (folder / "metadata.csv").write_text(f"{column},prompt\n" + "".join(f"{name},{prompt}\n" for name, prompt in rows))


def test_images_load_at_their_buckets_and_the_key_says_so_beforehand(tmp_path):
    sizes = {"wide.png": (300, 100), "tall.png": (90, 200), "square.png": (70, 70), "wide2.png": (600, 210)}
    for name, size in sizes.items():
        Image.new("RGB", size, "red").save(tmp_path / name)
    write(tmp_path, [(name, name) for name in sizes])
    dataset = UnifiedDataset(tmp_path, tmp_path / "metadata.csv", max_pixels=BUDGET, buckets=True)
    buckets = bucket_sizes(BUDGET, 16)
    for index, (name, size) in enumerate(sizes.items()):
        image = dataset[index]["image"]
        assert image.size == nearest_bucket(*size, buckets) and image.size in buckets
        assert dataset.bucket_key(index) == (("image", image.size),)
    assert dataset.bucket_key(0) == dataset.bucket_key(3)  # 3:1 and about 2.9:1 share a bucket


def test_a_sideways_photo_is_keyed_upright(tmp_path):
    image = Image.new("RGB", (120, 60), "blue")
    exif = image.getexif()
    exif[0x0112] = 6  # rotate 90 degrees to display: the picture is 60 wide and 120 tall
    image.save(tmp_path / "sideways.jpg", exif=exif.tobytes())
    write(tmp_path, [("sideways.jpg", "a photo")])
    dataset = UnifiedDataset(tmp_path, tmp_path / "metadata.csv", max_pixels=BUDGET, buckets=True)
    loaded = dataset[0]["image"]
    assert loaded.height > loaded.width and dataset.bucket_key(0) == (("image", loaded.size),)


def test_a_rotated_video_is_keyed_as_displayed(tmp_path):
    encode(tmp_path / "portrait.mp4", "libx264", 5, size=(96, 48), rotation=90)
    write(tmp_path, [("portrait.mp4", "a clip")], column="video")
    dataset = UnifiedDataset(tmp_path, tmp_path / "metadata.csv", max_pixels=BUDGET, buckets=True, num_frames=5)
    frames = dataset[0]["video"]
    assert frames[0].height > frames[0].width
    assert dataset.bucket_key(0) == (("video", (*frames[0].size, len(frames))),)


def test_the_model_side_multiple_shapes_the_buckets(tmp_path):
    Image.new("RGB", (300, 100), "red").save(tmp_path / "wide.png")
    write(tmp_path, [("wide.png", "wide")])
    dataset = UnifiedDataset(tmp_path, tmp_path / "metadata.csv", max_pixels=128 * 128, buckets=True)
    dataset.use_size_multiple(32)
    width, height = dataset[0]["image"].size
    assert width % 32 == 0 and height % 32 == 0 and dataset.fingerprint_settings()["division_factor"] == 32
    assert dataset.fingerprint_settings()["buckets"] is True
    assert "buckets" not in UnifiedDataset(tmp_path, tmp_path / "metadata.csv").fingerprint_settings()


def truncated_wide(path):
    """A 128 x 64 PNG of noise whose body is cut off: its header reads, its pixels do not."""
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 128, 3), dtype=np.uint8)).save(path)
    path.write_bytes(path.read_bytes()[:400])


def test_a_skipped_sample_is_replaced_from_its_own_bucket(tmp_path):
    for name, size in (("wide.png", (128, 64)), ("tall.png", (64, 128)), ("wide2.png", (130, 66))):
        Image.new("RGB", size, "green").save(tmp_path / name)
    truncated_wide(tmp_path / "broken.png")
    write(tmp_path, [("wide.png", "wide"), ("broken.png", "broken"), ("tall.png", "tall"), ("wide2.png", "wide2")])
    dataset = UnifiedDataset(tmp_path, tmp_path / "metadata.csv", max_pixels=BUDGET, buckets=True,
                             on_bad_sample="skip")
    sample = dataset[1]  # the next readable row is tall.png, of another bucket; wide2.png shares the broken one's
    assert [bad.path for bad in pop_skipped(sample)] == ["broken.png"]
    assert sample["prompt"] == "wide2" and dataset.bucket_key(1) == dataset.bucket_key(3) != dataset.bucket_key(2)
    plain = UnifiedDataset(tmp_path, tmp_path / "metadata.csv", max_pixels=BUDGET, on_bad_sample="skip")
    assert plain[1]["prompt"] == "tall"


def test_video_keys_hold_the_frame_count(tmp_path):
    encode(tmp_path / "a.mp4", "libx264", 9, size=(96, 64))
    write(tmp_path, [("a.mp4", "a clip")], column="video")
    strict = UnifiedDataset(tmp_path, tmp_path / "metadata.csv", max_pixels=BUDGET, buckets=True, num_frames=5)
    assert strict.bucket_key(0)[0][1][2] == len(strict[0]["video"]) == 5
    lenient = UnifiedDataset(tmp_path, tmp_path / "metadata.csv", max_pixels=BUDGET, buckets=True, num_frames=13,
                             allow_shorter_videos=True)
    assert lenient.bucket_key(0)[0][1][2] == len(lenient[0]["video"]) == 9
