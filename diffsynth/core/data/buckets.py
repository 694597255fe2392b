"""Aspect-ratio buckets, and the batch sampler that draws each batch from one bucket.

The samples of one batch must share a shape, so with buckets (``--batch_size`` above 1, or
``--aspect_ratio_buckets``) an image is not brought to a size of its own: it goes to the **bucket** whose aspect ratio
is nearest its own (in log ratio, so 2:1 and 1:2 are equally far from 1:1), scaled to cover it and centre-cropped,
up or down. A video's frames go to the bucket of its first frame. The buckets of a pixel budget ``P``
(``--max_pixels``) and a side multiple ``m`` (the model's: 16 for Qwen-Image and Wan2.1, 32 for the Wan2.2 VAE) are,
for every width ``w`` on a grid of step ``s``, the tallest height ``h`` (a multiple of ``m``) with ``w * h <= P`` and
``h <= w`` (landscape, up to an aspect ratio of ``MAX_ASPECT_RATIO``), and the same pairs turned portrait. The step ``s`` is about a sixteenth of
``sqrt(P)`` (64 pixels at one megapixel; a multiple of ``m``), so a dataset of any resolution spreads over a few dozen
buckets at most and partly filled batches stay rare.

The batch sampler (``BucketBatchSampler``) deals one epoch as follows, from ``(seed, epoch)`` alone: draw the same
permutation of the dataset as a run without batches; walk it, putting each sample in its bucket's pending batch, and
emit a batch whenever one fills. At the end of the epoch each bucket's partly filled batch is emitted as a **smaller
last batch** (a bucket is never carried over into the next epoch, so every epoch sees every sample once and has the
same number of steps, which resuming counts on). With ``batch_size`` 1 the batches are the permutation itself, so a
run without batches trains exactly as before. Finally the batch list is padded to a multiple of the process count
with its own first batches, as accelerate evens a batch-1 epoch, so every process takes the same number of steps.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable, Iterator, Sequence

import torch
from torch.utils.data import Sampler

MAX_ASPECT_RATIO = 4.0
#: Bucket widths step by about ``sqrt(max_pixels) / BUCKET_STEPS``.
BUCKET_STEPS = 16


@functools.lru_cache(maxsize=16)
def bucket_sizes(max_pixels: int, multiple: int) -> tuple[tuple[int, int], ...]:
    """The ``(width, height)`` buckets of a pixel budget and side multiple, sorted (see the module docstring)."""
    step = multiple * max(1, round(math.sqrt(max_pixels) / (BUCKET_STEPS * multiple)))
    sizes = set()
    for width in range(step, int(math.sqrt(max_pixels * MAX_ASPECT_RATIO)) + 1, step):
        height = max_pixels // width // multiple * multiple
        # Landscape sizes from the width grid, portrait ones their transposes: no two buckets of near-equal ratio.
        if multiple <= height <= width <= height * MAX_ASPECT_RATIO:
            sizes.update({(width, height), (height, width)})
    if not sizes:  # a budget of one m x m square
        sizes.add((multiple, multiple))
    return tuple(sorted(sizes))


def nearest_bucket(width: int, height: int, sizes: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """The bucket whose aspect ratio is nearest ``width / height`` in log ratio; ties go to the larger area."""
    ratio = math.log(width / height)
    return min(sizes, key=lambda size: (abs(math.log(size[0] / size[1]) - ratio), -size[0] * size[1], -size[0]))


def epoch_permutation(size: int, seed: int, epoch: int) -> list[int]:
    """The order of the dataset in ``epoch``: a permutation drawn from ``(seed, epoch)`` alone, the same on every
    process, so a resumed run redraws it without saved generator state."""
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch.randperm(size, generator=generator).tolist()


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of dataset indices, each from one bucket, dealt as the module docstring says.

    Args:
        keys: The bucket of every dataset index (any hashable; samples with equal keys share a shape). ``None``: one
            bucket for all.
        batch_size: Samples per batch (``--batch_size``); a bucket's last batch of an epoch may hold fewer.
        seed: The run's seed.
        num_processes: Processes the batches are dealt to (accelerate deals them round robin).

    Raises:
        ValueError: ``batch_size`` or ``num_processes`` below 1, or ``keys`` empty.
    """

    #: accelerate reads a batch sampler's ``batch_size`` to even out batches; None tells it they vary in length (this
    #: sampler evens the batch count itself).
    batch_size = None

    def __init__(self, keys: Sequence[Hashable] | int, batch_size: int, seed: int, num_processes: int = 1) -> None:
        self.keys = [0] * keys if isinstance(keys, int) else list(keys)
        if not self.keys:
            raise ValueError("the dataset is empty; there is nothing to batch")
        if batch_size < 1 or num_processes < 1:
            raise ValueError(f"batch_size={batch_size} and num_processes={num_processes} must be at least 1")
        self.samples_per_batch, self.seed, self.num_processes, self.epoch = batch_size, seed, num_processes, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def bucket_counts(self) -> dict[Hashable, int]:
        """Samples per bucket, in the order buckets first appear in the dataset."""
        counts: dict[Hashable, int] = {}
        for key in self.keys:
            counts[key] = counts.get(key, 0) + 1
        return counts

    def epoch_batches(self) -> list[list[int]]:
        """This epoch's batches, padded to a multiple of the process count."""
        pending: dict[Hashable, list[int]] = {}
        batches = []
        for index in epoch_permutation(len(self.keys), self.seed, self.epoch):
            group = pending.setdefault(self.keys[index], [])
            group.append(index)
            if len(group) == self.samples_per_batch:
                batches.append(group)
                pending[self.keys[index]] = []
        batches += [group for group in pending.values() if group]
        return batches + [batches[index % len(batches)] for index in range(-len(batches) % self.num_processes)]

    def __iter__(self) -> Iterator[list[int]]:
        yield from self.epoch_batches()

    def __len__(self) -> int:
        batches = sum(math.ceil(count / self.samples_per_batch) for count in self.bucket_counts().values())
        return batches + (-batches % self.num_processes)


def describe_buckets(sampler: BucketBatchSampler, describe_key: Callable[[Hashable], str], shown: int = 12) -> str:
    """The dataset summary logged at start: every bucket (the fullest ``shown``), its samples and batches."""
    counts = sorted(sampler.bucket_counts().items(), key=lambda item: -item[1])
    size = sampler.samples_per_batch
    lines = [f"  {describe_key(key)}: {count} sample{'s' if count != 1 else ''}, "
             f"{math.ceil(count / size)} batch{'es' if math.ceil(count / size) != 1 else ''}"
             + (f" (last of {count % size})" if count % size and count > size else "")
             for key, count in counts[:shown]]
    if len(counts) > shown:
        lines.append(f"  ... and {len(counts) - shown} more buckets with {sum(c for _, c in counts[shown:])} samples")
    return (f"{len(sampler.keys)} samples in {len(counts)} bucket{'s' if len(counts) != 1 else ''}, batch size "
            f"{size}, {len(sampler)} batches per epoch:\n" + "\n".join(lines))
