"""Bringing a stage-1 cache folder in line with the dataset before stage 1 computes: what is kept, what is redone.

Each process of a stage-1 run owns the samples ``index % num_processes == process_index`` and their files in its
folder ``<output_path>/<process_index>/``; ``sync_stage_one_cache`` settles every sample it owns:

- **cached**: a file of the sample (in its folder, or in another process folder left by a run with another process
  count, then moved in) carries the fingerprint the sample has now. It is kept; when only the modification times of
  its data files moved (the dataset was copied or touched), the file is re-stamped with them.
- **changed**: a file exists but its fingerprint differs (a caption fixed, an image replaced, ``--max_pixels``
  changed, another VAE), or it has none or cannot be read. The file is deleted at once and the sample recomputed.
- **new**: no file; computed.
- **skipped**: the row failed to decode at start-up (``--on_bad_sample skip``); any file of it is deleted.

It also deletes the **orphans** it owns: files of sample indices the dataset no longer has (it shrank), and second
copies of a sample in other process folders. Deleting stale files before computing keeps one invariant even when a
rerun is killed half-way: every file in the folder matches the dataset of the last run, so stage 2 counts the
samples not yet redone as missing rather than training on old ones.

No two processes touch the same sample index, so they need no lock; they only have to meet at a barrier afterwards.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .cache import cache_file_path, cache_inventory, read_cache_fingerprint, restamp_cache_sample
from .fingerprint import SampleFingerprint


@dataclass
class CacheSync:
    """What ``sync_stage_one_cache`` found and did in one process.

    Attributes:
        todo: The sample indices to compute, in order.
        fingerprints: Index -> the fingerprint to store with the computed sample.
        cached: Samples kept.
        changed: Fingerprint part (``files``, ``row``, ``settings``, ``models``; ``unreadable`` for a file without
            a readable fingerprint) -> samples to recompute because of it (a sample counts once per differing part).
        changed_samples: Samples to recompute because their file was stale.
        new: Samples without a file.
        orphans: Files deleted because no sample of the dataset owns them.
        restamped: Kept files whose data files' modification times were updated.
        moved: Kept files moved in from another process's folder.
    """

    todo: list[int] = field(default_factory=list)
    fingerprints: dict[int, SampleFingerprint] = field(default_factory=dict)
    cached: int = 0
    changed: Counter = field(default_factory=Counter)
    changed_samples: int = 0
    new: int = 0
    orphans: int = 0
    restamped: int = 0
    moved: int = 0

    def counts(self) -> dict[str, object]:
        """The counters as plain values, to be gathered from every process and added up by ``summarise``."""
        return {"cached": self.cached, "changed": dict(self.changed), "changed_samples": self.changed_samples,
                "new": self.new, "orphans": self.orphans, "restamped": self.restamped, "moved": self.moved}


def summarise(counts: Iterable[dict[str, object]], skipped: int = 0) -> str:
    """One line for all processes, e.g. ``3 cached, 1 changed (row), 2 new, 1 orphan removed``."""
    total: Counter = Counter()
    reasons: Counter = Counter()
    for one in counts:
        reasons.update(one["changed"])
        total.update({key: value for key, value in one.items() if key != "changed"})
    parts = [f"{total['cached']} cached"]
    if total["changed_samples"]:
        parts.append(f"{total['changed_samples']} changed ({', '.join(sorted(reasons))})")
    parts.append(f"{total['new']} new")
    if total["orphans"]:
        parts.append(f"{total['orphans']} orphan{'s' if total['orphans'] != 1 else ''} removed")
    if skipped:
        parts.append(f"{skipped} skipped (undecodable)")
    if total["restamped"]:
        parts.append(f"{total['restamped']} re-stamped (data files touched, content unchanged)")
    if total["moved"]:
        parts.append(f"{total['moved']} moved between process folders")
    return ", ".join(parts)


def sync_stage_one_cache(folder: str | os.PathLike, process_index: int, num_processes: int, num_samples: int,
                         fingerprint_of: Callable[[int, SampleFingerprint | None], SampleFingerprint],
                         skipped: Collection[int] = ()) -> CacheSync:
    """Settles this process's samples of the cache in ``folder`` (see the module docstring).

    Args:
        folder: The stage-1 ``--output_path``.
        process_index: This process.
        num_processes: Processes in the run.
        num_samples: Rows of the dataset; sample indices run from 0 to ``num_samples - 1``.
        fingerprint_of: ``(index, stored fingerprint or None) -> the sample's fingerprint now``; the stored one lets
            it reuse file hashes.
        skipped: Indices left out of the run (undecodable at start-up).

    Returns:
        The samples to compute and the counts for the report.
    """
    sync = CacheSync()
    inventory = cache_inventory(folder)
    for index, paths in inventory.items():
        if index >= num_samples and index % num_processes == process_index:
            sync.orphans += _remove(paths)
    for index in range(process_index, num_samples, num_processes):
        target = cache_file_path(folder, process_index, index)
        # The file in this process's folder first: it is the one to keep when several match.
        paths = sorted(inventory.get(index, []), key=lambda path: path != target)
        if index in skipped:
            sync.orphans += _remove(paths)
            continue
        stored = {path: read_cache_fingerprint(path) for path in paths}
        current = fingerprint_of(index, next((found for found in stored.values() if found is not None), None))
        kept = next((path for path in paths if stored[path] is not None and not current.changed_parts(stored[path])),
                    None)
        if kept is None:
            if paths:
                sync.changed_samples += 1
                found = stored[paths[0]]
                sync.changed.update(current.changed_parts(found) if found is not None else ["unreadable"])
                _remove(paths)
            else:
                sync.new += 1
            sync.todo.append(index)
            sync.fingerprints[index] = current
            continue
        sync.cached += 1
        sync.orphans += _remove([path for path in paths if path != kept])
        if kept != target:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(kept, target)
            sync.moved += 1
        if stored[kept].files != current.files:
            restamp_cache_sample(target, current)
            sync.restamped += 1
    return sync


def _remove(paths: Iterable[Path]) -> int:
    count = 0
    for path in paths:
        path.unlink(missing_ok=True)
        count += 1
    return count
