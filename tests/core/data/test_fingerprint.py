"""Sample fingerprints: which edits change which part, when file hashes are reused, and the weights digest."""

import hashlib
import os

import pytest
import torch
from PIL import Image

from diffsynth.core.data import FileIdentity, SampleFingerprint, UnifiedDataset
from diffsynth.core.data.fingerprint import FINGERPRINT_PARTS, weights_digest

MODELS = "models-digest"
ROWS = "image,prompt,notes\na.png,a red square,x\nb.png,a blue square,y\n"


def make_dataset(folder, rows=None, **kwargs):
    """The dataset in ``folder``, first written there (two images, ``ROWS``) when missing; ``rows`` replaces the
    metadata."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, colour in (("a.png", "red"), ("b.png", "blue")):
        if not (folder / name).exists():
            Image.new("RGB", (64, 48), colour).save(folder / name)
    if rows is not None or not (folder / "metadata.csv").exists():
        (folder / "metadata.csv").write_text(rows or ROWS)
    return UnifiedDataset(folder, folder / "metadata.csv", **kwargs)


def test_the_file_part_records_size_mtime_and_the_whole_content_hash(tmp_path):
    fingerprint = make_dataset(tmp_path).fingerprint(0, MODELS)
    data = (tmp_path / "a.png").read_bytes()
    stat = os.stat(tmp_path / "a.png")
    assert fingerprint.files == (FileIdentity("a.png", len(data), stat.st_mtime_ns, hashlib.sha256(data).hexdigest()),)
    assert set(fingerprint.parts) == set(FINGERPRINT_PARTS) and fingerprint.parts["models"] == MODELS


@pytest.mark.parametrize("edit, part", [
    (lambda folder: (folder / "metadata.csv").write_text(
        "image,prompt,notes\na.png,a red square on white,x\nb.png,a blue square,y\n"), "row"),
    (lambda folder: Image.new("RGB", (64, 48), "green").save(folder / "a.png"), "files"),
])  # fmt: skip
def test_an_edit_changes_exactly_its_part(tmp_path, edit, part):
    before = make_dataset(tmp_path).fingerprint(0, MODELS)
    edit(tmp_path)
    after = make_dataset(tmp_path).fingerprint(0, MODELS, previous=before)
    assert after.changed_parts(before) == [part]
    other_row = make_dataset(tmp_path).fingerprint(1, MODELS)
    assert other_row.changed_parts(make_dataset(tmp_path).fingerprint(1, MODELS)) == []


def test_settings_and_models_are_parts_too(tmp_path):
    before = make_dataset(tmp_path).fingerprint(0, MODELS)
    assert make_dataset(tmp_path, max_pixels=1024).fingerprint(0, MODELS).changed_parts(before) == ["settings"]
    assert make_dataset(tmp_path, num_frames=5).fingerprint(0, MODELS).changed_parts(before) == [], \
        "--num_frames shapes no image, so an image dataset ignores it"
    assert make_dataset(tmp_path).fingerprint(0, "other").changed_parts(before) == ["models"]
    assert before.changed_parts(None) == list(FINGERPRINT_PARTS)


def test_a_column_the_pipeline_does_not_read_is_left_out(tmp_path):
    before = make_dataset(tmp_path).fingerprint(0, MODELS)
    after = make_dataset(tmp_path, "image,prompt,notes\na.png,a red square,changed\nb.png,a blue square,y\n")
    assert after.fingerprint(0, MODELS).changed_parts(before) == []
    # A column the pipeline reads where a row has it (LTX-2's frame_rate) is in.
    before = make_dataset(tmp_path, optional_columns=["notes"]).fingerprint(0, MODELS)
    after = make_dataset(tmp_path, "image,prompt,notes\na.png,a red square,again\nb.png,a blue square,y\n",
                         optional_columns=["notes"])
    assert after.fingerprint(0, MODELS).changed_parts(before) == ["row"]


def test_a_touched_file_is_rehashed_and_keeps_its_fingerprint_while_unchanged_stats_reuse_the_stored_hash(tmp_path):
    dataset = make_dataset(tmp_path)
    before = dataset.fingerprint(0, MODELS)
    path = tmp_path / "a.png"
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    touched = dataset.fingerprint(0, MODELS, previous=before)
    assert touched.changed_parts(before) == [] and touched.files != before.files
    # Same size and mtime: the stored hash is trusted without reading the file (the documented blind spot).
    data = bytearray(path.read_bytes())
    data[40] ^= 1
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert dataset.fingerprint(0, MODELS, previous=touched).changed_parts(touched) == []
    assert dataset.fingerprint(0, MODELS).changed_parts(touched) == ["files"], "a fresh hash sees the edit"


def test_the_fingerprint_round_trips_through_json(tmp_path):
    fingerprint = make_dataset(tmp_path).fingerprint(1, MODELS)
    assert SampleFingerprint.from_json(fingerprint.to_json()) == fingerprint


def test_the_weights_digest_sees_a_changed_weight_a_dtype_and_a_shape():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3000, 4), torch.nn.Linear(4, 2))
    first = weights_digest(model)
    assert weights_digest(model) == first
    with torch.no_grad():
        model[0].weight[-1, -1] += 1.0  # the last element: inside the sampled tail
    second = weights_digest(model)
    assert second != first
    assert weights_digest(model.to(torch.bfloat16)) != second
    assert weights_digest(torch.nn.Sequential(torch.nn.Linear(3000, 5), torch.nn.Linear(5, 2))) != first
