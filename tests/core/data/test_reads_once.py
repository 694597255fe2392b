"""A bucketed dataset opens each image's header and each video once: the start-up check's read gives the bucket key
too."""

import builtins
import collections
import os
import time

import av
import pytest
from PIL import Image

from diffsynth.core import file_memo
from diffsynth.core.data import UnifiedDataset
from tests.core.data.test_dataset_buckets import BUDGET, write
from tests.core.data.test_video import encode

AN_HOUR_AGO = time.time() - 3600


def save_old(path, size):
    """An image last changed an hour ago, as the files of a dataset prepared beforehand are."""
    Image.new("RGB", size, "red").save(path)
    os.utime(path, (AN_HOUR_AGO, AN_HOUR_AGO))


def test_a_bucketed_dataset_opens_each_image_once_before_decoding(tmp_path, monkeypatch):
    file_memo.forget()
    sizes = {"wide.png": (300, 100), "tall.jpg": (90, 200)}
    for name, size in sizes.items():
        save_old(tmp_path / name, size)
    write(tmp_path, [(name, name) for name in sizes])
    openings, real_open = collections.Counter(), builtins.open

    def counting_open(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and os.path.dirname(os.fspath(file)) == str(tmp_path):
            openings[os.path.basename(os.fspath(file))] += 1
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    dataset = UnifiedDataset(tmp_path, tmp_path / "metadata.csv", max_pixels=BUDGET, buckets=True)
    keys = [dataset.bucket_key(index) for index in range(len(sizes))]
    assert {name: openings[name] for name in sizes} == dict.fromkeys(sizes, 1)
    assert keys == [(("image", dataset[index]["image"].size),) for index in range(len(sizes))]  # decoding reads them

    save_old(tmp_path / "tall.jpg", (200, 90))  # replaced by a wide picture: its key is read again
    again = UnifiedDataset(tmp_path, tmp_path / "metadata.csv", max_pixels=BUDGET, buckets=True)
    assert again.bucket_key(1) == (("image", again[1]["image"].size),) != keys[1]
    file_memo.forget()


@pytest.mark.parametrize("container", ["mp4", "webm"])  # a frame count in the header, and one counted from packets
@pytest.mark.parametrize("allow_shorter", [False, True])
def test_a_bucketed_dataset_opens_each_video_once_before_decoding(tmp_path, monkeypatch, container, allow_shorter):
    file_memo.forget()
    codec = "libx264" if container == "mp4" else "libvpx-vp9"
    clips = {f"portrait.{container}": ((96, 48), 90, 9), f"short.{container}": ((64, 64), None, 7)}
    for name, (size, rotation, count) in clips.items():
        encode(tmp_path / name, codec, count, size=size, rotation=rotation)
        os.utime(tmp_path / name, (AN_HOUR_AGO, AN_HOUR_AGO))
    openings, real_open = collections.Counter(), av.open

    def counting_open(file, *args, **kwargs):
        openings[os.path.basename(os.fspath(file))] += 1
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(av, "open", counting_open)
    rows = list(clips) if allow_shorter else ["portrait." + container]  # 7 frames are too few for strict mode
    write(tmp_path, [(name, name) for name in rows], column="video")
    dataset = UnifiedDataset(tmp_path, tmp_path / "metadata.csv", max_pixels=BUDGET, buckets=True, num_frames=9,
                             allow_shorter_videos=allow_shorter)
    keys = [dataset.bucket_key(index) for index in range(len(rows))]
    assert dict(openings) == dict.fromkeys(rows, 1)
    loaded = [dataset[index]["video"] for index in range(len(rows))]
    assert keys == [(("video", (*frames[0].size, len(frames))),) for frames in loaded]  # as decoding gives them
    assert loaded[0][0].height > loaded[0][0].width  # the rotation, which only a decoded frame tells
    file_memo.forget()
