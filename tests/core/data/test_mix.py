"""DatasetMix: each row drawn as often as its dataset's repeats say, regularization rows in kohya's proportion, the
same list every epoch (so a resumed run redraws it), and batches of several datasets grouped by shape."""

import collections

import pytest
from PIL import Image

from diffsynth.core.data import DatasetError, UnifiedDataset
from diffsynth.core.data.buckets import BucketBatchSampler
from diffsynth.core.data.mix import DatasetMix, MixPart, read_mix_manifest, regularization_counts, write_mix_manifest
from diffsynth.training.objective.batches import batch_sampler


def images(folder, sizes, prompt="a photo"):
    """A dataset folder of solid images of ``sizes`` (width, height) and its metadata; returns the dataset."""
    folder.mkdir(parents=True, exist_ok=True)
    for index, size in enumerate(sizes):
        Image.new("RGB", size, (40 * index % 255, 90, 160)).save(folder / f"{index}.png")
    (folder / "metadata.csv").write_text("image,prompt\n" + "".join(f"{index}.png,{prompt} {index}\n"
                                                                     for index in range(len(sizes))))
    return folder


def dataset(folder, **options):
    return UnifiedDataset(folder, folder / "metadata.csv", max_pixels=64 * 64, **options)


def draws(mix):
    """How often an epoch draws each ``(part, row)``, counted through ``__getitem__``'s prompts and ``locate``."""
    counted = collections.Counter(mix.locate(index) for index in range(len(mix)))
    # The row each index loads is the row locate names (prompts are unique within a part).
    for index in range(len(mix)):
        number, row = mix.locate(index)
        assert mix[index]["prompt"] == mix.parts[number].dataset.rows[row]["prompt"]
    return counted


@pytest.fixture
def folders(tmp_path):
    return {"a": images(tmp_path / "a", [(64, 64)] * 3), "b": images(tmp_path / "b", [(64, 64)] * 2),
            "reg": images(tmp_path / "reg", [(64, 64)] * 4)}


def test_rows_are_drawn_as_their_repeats_say(folders):
    mix = DatasetMix([MixPart(dataset(folders["a"]), repeats=2, name="a"),
                      MixPart(dataset(folders["b"]), repeats=1, name="b")])
    counted = draws(mix)
    assert len(mix) == 3 * 2 + 2 * 1 and mix.train_draws == 8 and not mix.has_reg
    assert {row: counted[(0, row)] for row in range(3)} == {0: 2, 1: 2, 2: 2}
    assert {row: counted[(1, row)] for row in range(2)} == {0: 1, 1: 1}
    assert mix.draws_per_part() == [6, 2]


def test_the_dataset_repeat_multiplies_every_dataset(folders):
    mix = DatasetMix([MixPart(dataset(folders["a"]), repeats=2), MixPart(dataset(folders["b"]))], multiplier=3)
    assert mix.draws_per_part() == [18, 6]


def test_fewer_regularization_rows_are_cycled_to_as_many_draws_as_training(folders):
    # 3 rows x 2 + 2 rows = 8 training draws; 4 regularization rows are each drawn twice: half of the epoch.
    mix = DatasetMix([MixPart(dataset(folders["a"]), repeats=2), MixPart(dataset(folders["b"])),
                      MixPart(dataset(folders["reg"]), is_reg=True)])
    counted = draws(mix)
    assert len(mix) == 16 and mix.has_reg
    assert [counted[(2, row)] for row in range(4)] == [2, 2, 2, 2]
    assert sum(mix.is_reg(index) for index in range(len(mix))) == 8
    assert all(mix.is_reg(index) == (mix.locate(index)[0] == 2) for index in range(len(mix)))


def test_the_remainder_goes_to_the_first_regularization_rows(folders):
    # 3 training draws against 2 regularization rows: kohya takes both, then one more of the first.
    mix = DatasetMix([MixPart(dataset(folders["a"])), MixPart(dataset(folders["b"]), is_reg=True)])
    counted = draws(mix)
    assert [counted[(1, row)] for row in range(2)] == [2, 1]


def test_more_regularization_rows_than_training_draws_leave_the_last_ones_out(folders, caplog):
    mix = DatasetMix([MixPart(dataset(folders["b"])), MixPart(dataset(folders["reg"]), is_reg=True)])
    counted = draws(mix)
    assert [counted[(1, row)] for row in range(4)] == [1, 1, 0, 0]
    assert "2 regularization rows are not drawn" in caplog.text


def test_regularization_counts_follow_kohyas_loop():
    """An independent reference: kohya's DreamBoothDataset loop, written out plainly, without its overshoot."""

    def kohya(sizes, repeats, wanted):
        counts = [repeat for size, repeat in zip(sizes, repeats) for _ in range(size)]
        taken, result, first = 0, [0] * len(counts), True
        while taken < wanted:
            for index, repeat in enumerate(counts):
                add = min(repeat if first else 1, wanted - taken)
                result[index] += add
                taken += add
                if taken >= wanted:
                    break
            first = False
        return result

    for sizes, repeats, wanted in [([4], [1], 8), ([3, 2], [2, 1], 7), ([3, 2], [2, 1], 13), ([5], [3], 4),
                                   ([1, 1, 1], [1, 2, 3], 20), ([7], [1], 1)]:
        counts = regularization_counts(sizes, repeats, wanted)
        assert [int(value) for part in counts for value in part] == kohya(sizes, repeats, wanted)
        assert sum(int(part.sum()) for part in counts) == wanted


def test_a_mix_needs_training_rows_and_valid_repeats(folders):
    with pytest.raises(DatasetError, match="regularization images only"):
        DatasetMix([MixPart(dataset(folders["reg"]), is_reg=True)])
    with pytest.raises(DatasetError, match="repeats 0"):
        DatasetMix([MixPart(dataset(folders["a"]), repeats=0, name="datasets[0]")])


def test_batches_group_rows_of_several_datasets_by_shape(tmp_path):
    wide = images(tmp_path / "wide", [(128, 64)] * 3)
    square = images(tmp_path / "square", [(64, 64)] * 2)
    parts = [MixPart(dataset(wide, buckets=True), repeats=2), MixPart(dataset(square, buckets=True))]
    mix = DatasetMix(parts)
    sampler = batch_sampler(mix, 2, True, seed=5, num_processes=1, padded={}, log=False)
    shapes = {number: parts[number].dataset.bucket_key(0) for number in range(2)}
    assert shapes[0] != shapes[1]
    seen = collections.Counter()
    for batch in sampler.epoch_batches():
        assert len({shapes[mix.locate(index)[0]] for index in batch}) == 1  # one shape a batch
        seen.update(batch)
    assert sorted(seen) == list(range(len(mix))) and set(seen.values()) == {1}


def test_the_epoch_order_is_a_function_of_seed_and_epoch(folders):
    """What resuming counts on: a fresh mix and sampler redraw the same batches of the same rows."""

    def order(epoch):
        mix = DatasetMix([MixPart(dataset(folders["a"]), repeats=2), MixPart(dataset(folders["reg"]), is_reg=True)])
        sampler = BucketBatchSampler(len(mix), 1, seed=11)
        sampler.set_epoch(epoch)
        return [mix.locate(index) for batch in sampler.epoch_batches() for index in batch]

    assert order(1) == order(1) and order(1) != order(2)


def test_the_manifest_records_the_parts_for_stage_two(folders, tmp_path):
    parts = [MixPart(dataset(folders["a"]), repeats=2, name="datasets[0] (a)"),
             MixPart(dataset(folders["reg"]), is_reg=True, name="--reg_dataset_metadata_path (reg)")]
    assert read_mix_manifest(tmp_path / "cache") is None
    write_mix_manifest(tmp_path / "cache", parts)
    recorded = read_mix_manifest(tmp_path / "cache")
    assert [(entry["folder"], entry["repeats"], entry["is_reg"]) for entry in recorded] == [
        (tmp_path / "cache" / "datasets" / "0", 2, False), (tmp_path / "cache" / "datasets" / "1", 1, True)]
