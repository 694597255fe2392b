"""``DatasetMix``: several datasets read as one, each row drawn as often as its dataset's repeats say, and
regularization rows drawn in the proportion of kohya's sd-scripts.

An epoch of a mix is a fixed list of draws, each a row of one part (the parts are ``UnifiedDataset`` or
``CacheDataset`` objects that repeat nothing themselves):

- a training part of ``n`` rows and ``repeats`` r gives ``n * r * multiplier`` draws (``multiplier`` is
  ``--dataset_repeat``): every row ``r * multiplier`` times. ``N``, the training draws, sums them over the parts.
- the regularization parts together give exactly ``N`` draws, so half of an epoch is regularization, as kohya pairs
  each training image with one regularization image. Their rows are listed in order (each as often as its part's
  repeats); the first rows of that list are taken until ``N`` draws are reached; when the list is shorter than ``N``
  every row is taken and then one more draw is added to each row in turn, from the first, until ``N`` is reached
  (kohya's ``DreamBoothDataset`` loop, without its overshoot: the count is ``N`` exactly). Rows beyond ``N`` are not
  drawn at all, as in kohya.

Stage 1 of split training caches each part into a cache of its own, ``<output_path>/datasets/<k>``, and records the
parts (their folders, repeats and which are regularization) in ``<output_path>/datasets.json``
(:func:`write_mix_manifest`); stage 2 reads that file to rebuild the mix from the caches (:func:`read_mix_manifest`).

The list depends on the parts' sizes alone, not on the epoch, so the batch sampler permutes it like any dataset
(``buckets.BucketBatchSampler``), a resumed run redraws the same order from ``(seed, epoch)``, and each process takes
its share of the batches as with one dataset. ``is_reg`` tells which draws are regularization, so the training loop
can weight their loss (``--prior_loss_weight``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from ..files import atomic_write_json
from .errors import CacheError, DatasetError

#: In a stage-1 output folder: the parts of a mix, and the folder of their caches.
MIX_MANIFEST_FILE = "datasets.json"
MIX_CACHE_DIR = "datasets"
MIX_FORMAT_VERSION = 1

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class MixPart:
    """One dataset of a mix.

    Attributes:
        dataset: Its rows (built without repeats: ``len`` is its row count).
        repeats: Times an epoch draws each of its rows (at least 1); for a regularization part, its weight in the
            list the regularization draws are taken from.
        is_reg: Whether its rows are regularization images.
        name: How messages name it, e.g. ``datasets[1] (data/dogs/metadata.csv)``.
    """

    dataset: Any
    repeats: int = 1
    is_reg: bool = False
    name: str = ""


def regularization_counts(sizes: Sequence[int], repeats: Sequence[int], draws: int) -> list[np.ndarray]:
    """How often an epoch draws each row of the regularization parts (see the module docstring).

    Args:
        sizes: The rows of each regularization part.
        repeats: Each part's repeats.
        draws: The regularization draws wanted: the epoch's training draws.

    Returns:
        One vector per part, its rows' counts; they sum to ``draws``.
    """
    start = np.concatenate([np.full(size, repeat, dtype=np.int64) for size, repeat in zip(sizes, repeats)])
    counts = np.zeros_like(start)
    taken = np.cumsum(start)
    first = int(np.searchsorted(taken, draws))  # rows 0..first take their repeats; the last one maybe in part
    if first < len(start):
        counts[:first] = start[:first]
        counts[first] = draws - (taken[first - 1] if first else 0)
    else:
        counts[:] = start
        extra, rest = divmod(draws - int(taken[-1]), len(start))
        counts += extra
        counts[:rest] += 1
    return np.split(counts, np.cumsum(sizes)[:-1])


class DatasetMix(Dataset):
    """Several datasets as one, with regularization rows (see the module docstring).

    Args:
        parts: The datasets, training and regularization ones in any order; at least one training part.
        multiplier: Repeats of the whole epoch (``--dataset_repeat``), applied to every part.

    Raises:
        DatasetError: No training part, an empty part, or a repeat below 1.
    """

    def __init__(self, parts: Sequence[MixPart], multiplier: int = 1) -> None:
        self.parts = list(parts)
        if not any(not part.is_reg for part in self.parts):
            raise DatasetError("the datasets hold regularization images only; add the training images")
        for part in self.parts:
            if part.repeats < 1 or multiplier < 1:
                raise DatasetError(f"{part.name}: repeats {part.repeats} (times --dataset_repeat {multiplier}) must "
                                   "be at least 1")
            if not len(part.dataset):
                raise DatasetError(f"{part.name} holds no sample (every row was skipped); fix or drop it")
        owners, rows = [], []
        for number, part in enumerate(self.parts):
            if not part.is_reg:
                size = len(part.dataset)
                owners.append(np.full(size * part.repeats * multiplier, number, dtype=np.int64))
                rows.append(np.tile(np.arange(size, dtype=np.int64), part.repeats * multiplier))
        #: The epoch's training draws; the regularization draws follow them, as many.
        self.train_draws = int(sum(len(block) for block in owners))
        reg = [(number, part) for number, part in enumerate(self.parts) if part.is_reg]
        if reg:
            counts = regularization_counts([len(part.dataset) for _, part in reg], [part.repeats for _, part in reg],
                                           self.train_draws)
            for (number, _), count in zip(reg, counts):
                owners.append(np.full(int(count.sum()), number, dtype=np.int64))
                rows.append(np.repeat(np.arange(len(count), dtype=np.int64), count))
            unused = sum(int((count == 0).sum()) for count in counts)
            if unused:
                logger.warning("%d regularization rows are not drawn: an epoch takes as many regularization draws "
                               "as training draws (%d), as kohya's sd-scripts does", unused, self.train_draws)
        self._owner, self._row = np.concatenate(owners), np.concatenate(rows)

    def __len__(self) -> int:
        return len(self._owner)

    def locate(self, index: int) -> tuple[int, int]:
        """``(part number, row of that part)`` of draw ``index``."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} is out of range for a dataset of {len(self)} samples")
        return int(self._owner[index]), int(self._row[index])

    def locations(self) -> Iterator[tuple[int, int]]:
        """``locate`` of every draw, in index order."""
        return zip(self._owner.tolist(), self._row.tolist())

    def __getitem__(self, index: int) -> Any:
        number, row = self.locate(index)
        return self.parts[number].dataset[row]

    @property
    def has_reg(self) -> bool:
        """Whether the mix draws regularization rows."""
        return len(self) > self.train_draws

    def is_reg(self, index: int) -> bool:
        """Whether draw ``index`` is a regularization row."""
        return self.parts[self.locate(index)[0]].is_reg

    def describe_sample(self, index: int) -> str:
        """Where draw ``index`` comes from, for messages: its dataset and its row (or cache file)."""
        number, row = self.locate(index)
        part = self.parts[number]
        describe = getattr(part.dataset, "describe_sample", lambda row: f"row {row + 1}")
        return f"{part.name}: {describe(row)}"

    def draws_per_part(self) -> list[int]:
        """The draws of an epoch from each part, in the parts' order."""
        return np.bincount(self._owner, minlength=len(self.parts)).tolist()

    def summary(self) -> str:
        """One line per part: its rows, repeats and draws an epoch, for the start-up log."""
        lines = [f"  {part.name}: {len(part.dataset)} rows, repeats {part.repeats}, {draws} draws"
                 + (" (regularization)" if part.is_reg else "")
                 for part, draws in zip(self.parts, self.draws_per_part())]
        return f"{len(self)} draws an epoch from {len(self.parts)} datasets:\n" + "\n".join(lines)


def datasets_of(dataset: Any) -> list[Any]:
    """The datasets a run reads: a mix's parts, or the dataset itself."""
    return [part.dataset for part in dataset.parts] if isinstance(dataset, DatasetMix) else [dataset]


def write_mix_manifest(folder: str | os.PathLike, parts: Sequence[MixPart]) -> Path:
    """Writes ``<folder>/datasets.json``: each part's cache folder (``datasets/<k>``, relative), repeats, whether it
    is regularization, and its name."""
    entries = [{"folder": f"{MIX_CACHE_DIR}/{number}", "repeats": part.repeats, "is_reg": part.is_reg,
                "name": part.name} for number, part in enumerate(parts)]
    return atomic_write_json(Path(folder) / MIX_MANIFEST_FILE, {"format_version": MIX_FORMAT_VERSION,
                                                                "datasets": entries})


def read_mix_manifest(folder: str | os.PathLike) -> list[dict[str, Any]] | None:
    """The parts ``<folder>/datasets.json`` records (``folder`` made absolute), or None when the folder holds the
    cache of one dataset.

    Raises:
        CacheError: The file is unreadable; the message says to rerun stage 1.
    """
    path = Path(folder) / MIX_MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))["datasets"]
        return [{"folder": Path(folder) / entry["folder"], "repeats": int(entry["repeats"]),
                 "is_reg": bool(entry["is_reg"]), "name": str(entry["name"])} for entry in entries]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CacheError(f"{path} is unreadable ({type(error).__name__}: {error}); rerun `--task sft:data_process` "
                         f"with --output_path {folder}, which keeps what is cached") from error
