"""Video files: decoding (mp4, gif, webm, mkv, mov), first-frames and 4k+1 semantics, sizing, construction-time errors,
and the example video dataset."""

import csv
import random
import subprocess
import sys

import av
import numpy as np
import pytest
from PIL import Image

from diffsynth.core.data import (DatasetError, LoadVideo, ResizeConfig, UnifiedDataset, check_num_frames,
                                 operator_for, resize_and_crop)
from diffsynth.core.data.example_dataset import VIDEO_SIZE, build_example_video_dataset, draw_example_video, main
from diffsynth.core.data.video import VIDEO_EXTENSIONS, largest_valid_frame_count, probe_video

FULL, SEED = 9, 5  # frames per example clip, and the example dataset's seed


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """An example dataset of two 9-frame clips (video_000.mp4, video_001.gif) of 104x72 pixels."""
    folder = tmp_path_factory.mktemp("clips")
    build_example_video_dataset(folder, num_videos=2, num_frames=FULL, seed=SEED)
    return folder


def as_array(image):
    return np.asarray(image, dtype=np.float32)


def encode(path, codec, count, size=(96, 64), rotation=None):
    """A clip of ``count`` frames; frame i shows a white bar at x = 8 i in the top third, on black."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=8)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        if rotation is not None:
            stream.set_display_rotation(rotation)
        for index in range(count):
            pixels = np.zeros((size[1], size[0], 3), np.uint8)
            pixels[: size[1] // 3, 8 * index: 8 * index + 8] = 255
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        container.mux(stream.encode())
    return path


def dataset_of(folder, names, **kwargs):
    with open(folder / "metadata.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["video", "prompt"])
        writer.writerows([name, f"clip {name}"] for name in names)
    return UnifiedDataset(folder, folder / "metadata.csv", **kwargs)


@pytest.mark.parametrize("value", [0, -3, 2, 12, 80, 9.0, True, "81", None])
def test_num_frames_must_be_4k_plus_1(value, tmp_path):
    with pytest.raises(DatasetError) as error:
        check_num_frames(value)
    message = str(error.value)
    assert f"--num_frames {value!r}" in message and "4k+1" in message
    if value == 80:
        assert "--num_frames 77 or 81" in message
    # The dataset reports it before reading any file, even for an image-only dataset.
    Image.new("RGB", (32, 32)).save(tmp_path / "a.png")
    (tmp_path / "metadata.csv").write_text("image,prompt\na.png,x\n")
    with pytest.raises(DatasetError, match="--num_frames"):
        UnifiedDataset(tmp_path, tmp_path / "metadata.csv", num_frames=value)


@pytest.mark.parametrize("count, expected", [(0, 0), (1, 1), (4, 1), (5, 5), (8, 5), (9, 9), (80, 77), (81, 81)])
def test_largest_valid_frame_count(count, expected):
    assert largest_valid_frame_count(count) == expected


@pytest.mark.parametrize("extension", VIDEO_EXTENSIONS + (".MP4", ".GIF"))
def test_video_extensions_map_to_the_video_operator(extension):
    assert operator_for(f"a/b{extension}", "video").kind == "video"


@pytest.mark.parametrize("index, name", [(0, "video_000.mp4"), (1, "video_001.gif")])
def test_a_clip_decodes_to_its_first_frames_in_order_sized_like_images(clips, index, name):
    frames = LoadVideo(num_frames=FULL).load(clips / name, ResizeConfig())
    assert len(frames) == FULL
    assert all(frame.mode == "RGB" and frame.size == (96, 64) for frame in frames)  # 104x72 rounded down to 16s
    fixed = LoadVideo(num_frames=5).load(clips / name, ResizeConfig(height=32, width=64))
    assert [frame.size for frame in fixed] == [(64, 32)] * 5
    # num_frames=5 gives the first five of the nine frames, not five spread over the clip.
    first = LoadVideo(num_frames=5).load(clips / name, ResizeConfig())
    assert all(np.array_equal(as_array(a), as_array(b)) for a, b in zip(first, frames[:5], strict=True))
    # The shape moves, so neighbouring frames differ, and decoded frame i is closest to drawn frame i.
    assert all(np.abs(as_array(a) - as_array(b)).mean() > 1 for a, b in zip(frames, frames[1:]))
    rng = random.Random(SEED)
    for _ in range(index + 1):  # the builder draws its clips from one rng, in order
        drawn, _ = draw_example_video(rng, FULL, VIDEO_SIZE)
    drawn = [resize_and_crop(frame, 96, 64) for frame in drawn]
    for position, frame in enumerate(frames):
        errors = [np.abs(as_array(frame) - as_array(candidate)).mean() for candidate in drawn]
        assert int(np.argmin(errors)) == position and errors[position] < 8, (name, position, errors)


@pytest.mark.parametrize("name, codec", [("clip.webm", "libvpx-vp9"), ("clip.mkv", "libx264"), ("clip.mov", "libx264"),
                                         ("clip.mp4", "mpeg4")])
def test_other_containers_decode_and_are_counted_without_decoding(tmp_path, name, codec):
    path = encode(tmp_path / name, codec, 9)
    assert probe_video(path).frames == 9  # webm and mkv store no count: their packets are counted
    # Counting packets stops once enough are seen; a count stored in the header (mp4, mov) is taken as it is.
    assert probe_video(path, stop_at=5).frames == (5 if name.endswith((".webm", ".mkv")) else 9)
    frames = LoadVideo(num_frames=5).load(path, ResizeConfig())
    assert len(frames) == 5 and frames[0].size == (96, 64)
    bar_columns = [int(np.argmax(as_array(frame)[5, :, 0])) for frame in frames]
    assert bar_columns == [0, 8, 16, 24, 32], "frames must come in order, starting at the first"


def test_a_stored_rotation_is_applied(tmp_path):
    path = encode(tmp_path / "portrait.mp4", "libx264", 5, rotation=90)
    frames = LoadVideo(num_frames=5).load(path, ResizeConfig())
    assert frames[0].size == (64, 96)
    # Turned a quarter counter-clockwise, the bar at the top left of the first frame is now at the bottom left.
    pixels = as_array(frames[0])[..., 0]
    assert pixels[90, 5] > 200 and pixels[5, 5] < 50


def test_a_dataset_with_a_video_column_returns_lists_of_frames(clips):
    dataset = UnifiedDataset(clips, clips / "metadata.csv", num_frames=5, max_pixels=64 * 48, repeat=2)
    assert len(dataset) == 4
    sample = dataset[3]
    assert isinstance(sample["video"], list) and len(sample["video"]) == 5
    assert all(isinstance(frame, Image.Image) and frame.size == (64, 32) for frame in sample["video"])
    assert sample["prompt"] == dataset.rows[1]["prompt"] and "moving" in sample["prompt"]


def test_a_too_short_video_fails_at_construction_naming_file_counts_and_fix(tmp_path, monkeypatch):
    encode(tmp_path / "short.mp4", "libx264", 7)
    # Construction must not decode: a decode would hit this.
    monkeypatch.setattr(LoadVideo, "load", lambda *args: pytest.fail("construction decoded a video"))
    with pytest.raises(DatasetError) as error:
        dataset_of(tmp_path, ["short.mp4"], num_frames=9)
    message = str(error.value)
    for part in ["short.mp4", "row 1", "'video'", "has 7 frames", "the 9 that --num_frames", "--num_frames 5",
                 "allow_shorter_videos"]:
        assert part in message, message


def test_shorter_videos_can_be_trimmed_to_4k_plus_1_instead(tmp_path):
    encode(tmp_path / "short.webm", "libvpx-vp9", 7)
    dataset = dataset_of(tmp_path, ["short.webm"], num_frames=9, allow_shorter_videos=True)
    assert len(dataset[0]["video"]) == 5
    with pytest.raises(DatasetError, match="allow_shorter"):
        LoadVideo(num_frames=9, allow_shorter="yes")


@pytest.mark.parametrize("content", [b"\x00" * 64, b"not a video at all", b""])
def test_an_unreadable_video_fails_at_construction_naming_the_file(tmp_path, content):
    (tmp_path / "broken.mp4").write_bytes(content)
    with pytest.raises(DatasetError) as error:
        dataset_of(tmp_path, ["broken.mp4"])
    message = str(error.value)
    assert "broken.mp4" in message and "row 1" in message and "not a video" in message
    assert message.count("broken.mp4") == 1, "PyAV's own copy of the path is left out"


def test_a_truncated_video_that_passes_the_check_fails_on_load_naming_the_file(clips, tmp_path):
    path = tmp_path / "cut.gif"
    data = (clips / "video_001.gif").read_bytes()
    path.write_bytes(data[: len(data) * 6 // 10])
    LoadVideo(num_frames=5).check(path, ResizeConfig())
    with pytest.raises(DatasetError) as error:
        LoadVideo(num_frames=9).load(path, ResizeConfig())
    assert str(path) in str(error.value)


def test_importing_the_data_package_does_not_import_pyav():
    code = "import sys, diffsynth.core.data; assert 'av' not in sys.modules, 'av imported eagerly'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_example_video_dataset_is_deterministic(tmp_path):
    first, second, other = (build_example_video_dataset(tmp_path / name, num_videos=2, num_frames=5, seed=seed).parent
                            for name, seed in (("a", 3), ("b", 3), ("c", 4)))
    names = sorted(path.name for path in first.iterdir())
    assert names == ["metadata.csv", "video_000.mp4", "video_001.gif"]
    assert all((first / name).read_bytes() == (second / name).read_bytes() for name in names)
    assert (first / "metadata.csv").read_text() != (other / "metadata.csv").read_text()
    with open(first / "metadata.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["video", "prompt"] and all("moving" in row["prompt"] for row in rows)


def test_a_long_example_clip_keeps_every_frame_distinct(tmp_path):
    # More frames than pixels to cross: the shape wraps round, so the GIF writer merges no frames.
    build_example_video_dataset(tmp_path, num_videos=2, num_frames=41, size=(48, 32))
    assert probe_video(tmp_path / "video_001.gif").frames == 41
    assert probe_video(tmp_path / "video_000.mp4").frames == 41


@pytest.mark.parametrize("kwargs, flag", [({"num_videos": 0}, "--num_videos"), ({"num_frames": 0}, "--num_frames"),
                                          ({"size": (101, 72)}, "--width"), ({"size": (16, 16)}, "--width")])
def test_bad_example_video_arguments_name_the_flag(tmp_path, kwargs, flag):
    with pytest.raises(DatasetError, match=flag):
        build_example_video_dataset(tmp_path, **kwargs)


def test_example_video_command_line(tmp_path, capsys):
    assert main(["--output", str(tmp_path), "--kind", "video", "--num_videos", "1", "--num_frames", "6"]) == 0
    printed = capsys.readouterr().out
    assert "--dataset_metadata_path" in printed and "--num_frames 5" in printed
    assert probe_video(tmp_path / "video_000.mp4").frames == 6
