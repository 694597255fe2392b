"""Aspect-ratio buckets and the bucket batch sampler: sizes, nearest ratios, the epoch's batches and their order."""

import math

import pytest

from diffsynth.core.data.buckets import (MAX_ASPECT_RATIO, BucketBatchSampler, bucket_sizes, describe_buckets,
                                         epoch_permutation, nearest_bucket)


@pytest.mark.parametrize("max_pixels, multiple", [(1024 * 1024, 16), (832 * 480, 32), (4096, 16), (256, 16)])
def test_buckets_fit_the_budget_in_multiples_of_the_model_side(max_pixels, multiple):
    sizes = bucket_sizes(max_pixels, multiple)
    assert sizes
    for width, height in sizes:
        assert width % multiple == 0 and height % multiple == 0 and width * height <= max_pixels
        assert max(width / height, height / width) <= MAX_ASPECT_RATIO
        assert (height, width) in sizes  # both orientations
        # As large as the budget allows: one side cannot grow by one multiple (the tallest for its width, or the
        # widest for its height).
        assert max(width * (height + multiple), (width + multiple) * height) > max_pixels
    assert (int(math.sqrt(max_pixels)) // multiple * multiple,) * 2 in sizes or max_pixels == 832 * 480


def test_a_megapixel_gives_a_few_dozen_buckets_with_the_square():
    sizes = bucket_sizes(1024 * 1024, 16)
    assert (1024, 1024) in sizes and 20 <= len(sizes) <= 60


@pytest.mark.parametrize("size, expected", [((1920, 1080), 16 / 9), ((1080, 1920), 9 / 16), ((300, 300), 1.0),
                                            ((4000, 100), MAX_ASPECT_RATIO)])
def test_each_image_goes_to_the_bucket_of_nearest_ratio(size, expected):
    sizes = bucket_sizes(1024 * 1024, 16)
    width, height = nearest_bucket(*size, sizes)
    best = min(abs(math.log(w / h) - math.log(size[0] / size[1])) for w, h in sizes)
    assert abs(math.log(width / height) - math.log(size[0] / size[1])) == best
    assert abs(width / height - expected) < 0.12 * expected


def test_batch_one_deals_the_plain_permutation():
    sampler = BucketBatchSampler(["a", "b", "a", "c"] * 5, 1, seed=4)
    assert [batch[0] for batch in sampler] == epoch_permutation(20, 4, 0)
    sampler.set_epoch(1)
    assert [batch[0] for batch in sampler] == epoch_permutation(20, 4, 1) != epoch_permutation(20, 4, 0)
    assert epoch_permutation(20, 5, 0) != epoch_permutation(20, 4, 0)


def test_batches_come_from_one_bucket_and_cover_the_epoch_once():
    keys = ["wide"] * 8 + ["tall"] * 4 + ["square"] * 1
    sampler = BucketBatchSampler(keys, 3, seed=1)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 3 + 2 + 1
    assert all(len({keys[index] for index in batch}) == 1 for batch in batches)
    assert sorted(index for batch in batches for index in batch) == list(range(13))
    # Full batches in the order they fill along the epoch's permutation, then each bucket's smaller last batch.
    sizes = [len(batch) for batch in batches]
    assert sizes.count(3) == 3 and sorted(sizes[3:]) == [1, 1, 2]
    order = epoch_permutation(13, 1, 0)
    fills = [max(order.index(index) for index in batch) for batch in batches if len(batch) == 3]
    assert fills == sorted(fills)
    assert batches == list(BucketBatchSampler(keys, 3, seed=1))  # a function of (seed, epoch) alone


@pytest.mark.parametrize("processes", [2, 4])
def test_the_batch_count_is_evened_over_the_processes_with_the_first_batches(processes):
    keys = ["a"] * 5 + ["b"] * 2
    sampler = BucketBatchSampler(keys, 2, seed=3, num_processes=processes)
    batches = sampler.epoch_batches()
    assert len(batches) % processes == 0 and len(batches) == len(sampler)
    plain = BucketBatchSampler(keys, 2, seed=3).epoch_batches()
    assert batches[:len(plain)] == plain and batches[len(plain):] == [plain[i % len(plain)]
                                                                       for i in range(len(batches) - len(plain))]


def test_the_summary_names_every_bucket_and_its_batches():
    sampler = BucketBatchSampler(["wide"] * 5 + ["tall"] * 2, 2, seed=0)
    summary = describe_buckets(sampler, lambda key: f"<{key}>")
    assert "7 samples in 2 buckets, batch size 2, 4 batches per epoch" in summary
    assert "<wide>: 5 samples, 3 batches (last of 1)" in summary and "<tall>: 2 samples, 1 batch" in summary
    with pytest.raises(ValueError, match="batch_size=0"):
        BucketBatchSampler(3, 0, seed=0)
