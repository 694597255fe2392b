"""Samples whose files cannot be decoded: found at start-up or when first read, then skipped or fatal.

The header check at dataset construction cannot see a file whose body is damaged (a truncated download, a disk
error). Such a file is found by decoding it, either

- **at start-up**, when the whole dataset decodes to at most ``STARTUP_DECODE_PIXELS`` pixels: every file the run
  will read is decoded once before any model loads, each process taking its share; or
- **on first touch**, for larger datasets, when stage 1 or training reads the sample.

``--on_bad_sample`` decides what follows. ``stop`` (the default) raises an error naming the metadata row, the column
and the file. ``skip`` goes on without the sample, warns and counts it:

- found at start-up, the bad rows are left out of the dataset in every process alike (the processes share what they
  found), so every process sees the same shorter epoch;
- found on first touch in training, the sample's place is taken by the next readable row, decoded in its stead by
  the same process. A process cannot simply drop a sample there: accelerate deals each process its share of every
  epoch, and a process with one sample fewer would wait forever for its peers at the next gradient sync. The
  replacement keeps every process's step count, and depends only on the dataset, so a rerun replaces alike;
- in stage 1, the sample is not cached, and the cache's manifest lists it as skipped, so stage 2 does not count it
  as missing. A rerun of stage 1 tries it again.

The skipped samples travel with the sample that replaced them, under ``SKIPPED_KEY``, so the training loop can warn
and count them even when dataloader workers decode in other processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import DatasetError

ON_BAD_SAMPLE_CHOICES = ("stop", "skip")
# Decoding runs at 50-270 megapixels per second and core here (PNG 87, JPEG 270, WebP 52, H.264 video 100 with two
# threads), so a gigapixel (1,000 one-megapixel images, or 30 clips of 81 frames at 832x480) takes 4 to 20 seconds,
# spread over the processes: a small price next to loading the models. Pixels rather than bytes or files, because
# decode time follows pixels while a megabyte of video holds a hundred times the pixels of a megabyte of PNG.
STARTUP_DECODE_PIXELS = 1_000_000_000
SKIPPED_KEY = "diffsynth.skipped_samples"


@dataclass(frozen=True)
class BadSample:
    """A metadata row whose data file failed to decode.

    Attributes:
        index: The row's index (0-based; the stage-1 sample index).
        column: The metadata column naming the file.
        path: The file as the metadata names it.
        reason: The decoder's error.
    """

    index: int
    column: str
    path: str
    reason: str

    def describe(self) -> str:
        """``row N (column 'image': a.png): reason``, rows counted from 1 as in the metadata file."""
        return f"row {self.index + 1} (column {self.column!r}: {self.path}): {self.reason}"


class BadSampleError(DatasetError):
    """A sample's data file failed to decode; ``bad`` says which."""

    def __init__(self, message: str, bad: BadSample) -> None:
        super().__init__(message)
        self.bad = bad

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (str(self), self.bad)


def check_on_bad_sample(value: str) -> None:
    """Rejects an ``--on_bad_sample`` other than ``stop`` or ``skip``."""
    if value not in ON_BAD_SAMPLE_CHOICES:
        raise DatasetError(f"--on_bad_sample {value!r} must be one of {', '.join(ON_BAD_SAMPLE_CHOICES)}")


def bad_samples_error(bad: Sequence[BadSample], metadata_path: str, shown: int = 10) -> DatasetError:
    """The error that stops a run over ``bad`` samples found at start-up, naming the first ``shown`` of them."""
    lines = "\n  ".join(sample.describe() for sample in bad[:shown])
    more = f"\n  ... and {len(bad) - shown} more" if len(bad) > shown else ""
    return DatasetError(
        f"{len(bad)} sample(s) of metadata {metadata_path} cannot be decoded:\n  {lines}{more}\nReplace those files, "
        "remove their rows, or pass --on_bad_sample skip to train without them"
    )


def pop_skipped(sample: dict[str, Any]) -> list[BadSample]:
    """Removes and returns the samples skipped to produce ``sample`` (empty for an ordinary sample)."""
    return list(sample.pop(SKIPPED_KEY, ()))
