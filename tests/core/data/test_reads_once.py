"""A bucketed dataset opens each image's header once: the start-up check's read gives the bucket key too."""

import builtins
import collections
import os
import time

from PIL import Image

from diffsynth.core import file_memo
from diffsynth.core.data import UnifiedDataset
from tests.core.data.test_dataset_buckets import BUDGET, write

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
