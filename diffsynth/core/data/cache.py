"""The stage-1 cache of split training: one safetensors file per sample, and the dataset that reads them back.

Stage 1 (``--task sft:data_process``) runs the units that need no trainable model and saves each sample's state to
``<output_path>/<process_index>/<sample_index>.safetensors``, the sample index being the metadata row's (0-based).
Each file holds the state's tensors under their paths and, in its metadata, the tagged JSON structure
(``cache_codec``), the cache info and the sample's fingerprint (``fingerprint``: the files, cells, settings and
models it was computed from).

Two JSON files describe the folder:

- ``cache_info.json``: what the cache is for, i.e. what stage 2 must agree on (format version, pipeline, stage-2
  units, cached keys, the trained models' configs). Stage 2 compares it field by field with what it expects, so a
  cache made for another model or another unit split fails at start-up. A stage-1 rerun into the folder with other
  such info is refused too: the folder would mix two caches.
- ``cache_manifest.json``: what the last stage-1 run was asked to cache: the number of samples (metadata rows), the
  rows it skipped as undecodable, and its command line. Stage 2 checks that every other sample is there.

Files are written atomically, so a killed stage 1 leaves only complete files. A rerun (``cache_sync``) keeps every
file whose fingerprint matches, recomputes the rest and removes the files of samples that no longer exist.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open
from torch.utils.data import Dataset

from ..files import atomic_save_safetensors, atomic_write_json
from .cache_codec import decode_state, encode_state
from .dataset import check_repeat
from .errors import CacheError, DataFileNotFoundError
from .fingerprint import SampleFingerprint

logger = logging.getLogger(__name__)

# 2: each sample carries its fingerprint, and the folder a manifest.
CACHE_FORMAT_VERSION = 2
CACHE_INFO_FILE = "cache_info.json"
CACHE_MANIFEST_FILE = "cache_manifest.json"
_STRUCTURE_KEY = "diffsynth.cache.structure"
_INFO_KEY = "diffsynth.cache.info"
_VERSION_KEY = "diffsynth.cache.format_version"
_FINGERPRINT_KEY = "diffsynth.cache.fingerprint"
_RERUN = ("rerun `--task sft:data_process` for this model and these units into a fresh --output_path, or point "
          "--dataset_base_path at the cache made for them")


def make_cache_info(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The info that identifies a cache: ``fields`` as plain JSON, plus ``format_version``.

    Args:
        fields: What stage 1 was run with and stage 2 must match, e.g. ``{"model_files": [...], "units": [...],
            "keys": [...]}``. Tuples become lists so the info compares equal after a JSON round trip.

    Raises:
        CacheError: A value is not JSON-serialisable.
    """
    try:
        normalised = json.loads(json.dumps(dict(fields), sort_keys=True))
    except (TypeError, ValueError) as error:
        raise CacheError(f"cache info must be plain JSON (str, numbers, lists, dicts): {error}") from error
    return {**normalised, "format_version": CACHE_FORMAT_VERSION}


def cache_file_path(output_path: str | os.PathLike, process_index: int, sample_index: int) -> Path:
    """``<output_path>/<process_index>/<sample_index>.safetensors``: one folder per process, so processes never race."""
    for name, value in (("process_index", process_index), ("sample_index", sample_index)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise CacheError(f"{name}={value!r} must be a non-negative integer")
    return Path(output_path) / str(process_index) / f"{sample_index}.safetensors"


def save_cache_sample(path: str | os.PathLike, state: Mapping[str, Any], info: Mapping[str, Any],
                      fingerprint: SampleFingerprint | None = None) -> Path:
    """Writes one sample's state atomically (tensors moved to the CPU first).

    Args:
        path: The file, usually from ``cache_file_path``.
        state: ``{"shared": {...}, "posi": {...}, "nega": {...}}`` (see ``cache_codec``).
        info: The cache info (``make_cache_info``); stored so that each file can be traced to the run that made it.
        fingerprint: What the sample was computed from; a stage-1 rerun recomputes the sample when it differs. A file
            without one counts as changed.

    Raises:
        CacheError: The state holds a value the cache cannot store; the message names its path.
    """
    tensors, structure = encode_state(state)
    metadata = {
        "format": "pt",
        _VERSION_KEY: str(CACHE_FORMAT_VERSION),
        _STRUCTURE_KEY: json.dumps(structure),
        _INFO_KEY: json.dumps(make_cache_info(info), sort_keys=True),
    }
    if fingerprint is not None:
        metadata[_FINGERPRINT_KEY] = fingerprint.to_json()
    return atomic_save_safetensors(tensors, path, metadata=metadata)


def read_cache_fingerprint(path: str | os.PathLike) -> SampleFingerprint | None:
    """The fingerprint stored in a cache file, reading only its header; None for a missing, unreadable or
    fingerprint-less file (all of which a stage-1 rerun recomputes)."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            return SampleFingerprint.from_json(_checked_metadata(path, handle)[_FINGERPRINT_KEY])
    except (SafetensorError, OSError, KeyError, ValueError, TypeError, CacheError):
        return None


def restamp_cache_sample(path: str | os.PathLike, fingerprint: SampleFingerprint) -> Path:
    """Rewrites a cache file with ``fingerprint`` in place of its stored one, tensors untouched.

    For files that were touched or copied without a change of content: their new modification times are recorded,
    so the next rerun trusts them without hashing again.
    """
    path = Path(path)
    with safe_open(str(path), framework="pt", device="cpu") as handle:
        metadata = {**_checked_metadata(path, handle), _FINGERPRINT_KEY: fingerprint.to_json()}
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    return atomic_save_safetensors(tensors, path, metadata=metadata)


def _corrupt(path: Path, error: BaseException) -> CacheError:
    return CacheError(
        f"cache file {path} is corrupt or not a diffsynth cache file ({type(error).__name__}: {error}); delete it and "
        "rerun `--task sft:data_process` with the same --output_path, which redoes only the missing samples"
    )


def _checked_metadata(path: Path, handle: Any) -> dict[str, str]:
    """The open file's metadata, checked to be a cache file of a format this version reads."""
    metadata = handle.metadata() or {}
    version = int(metadata[_VERSION_KEY])
    if version > CACHE_FORMAT_VERSION:
        raise CacheError(f"cache file {path} has format version {version}, newer than this diffsynth reads "
                         f"({CACHE_FORMAT_VERSION}); upgrade diffsynth or rerun stage 1 with this version")
    return metadata


def load_cache_sample(path: str | os.PathLike, expected_info: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Reads one sample's state, tensors on the CPU.

    Args:
        path: A file written by ``save_cache_sample``.
        expected_info: When given, the file's stored info must equal it (a file copied in from another cache fails).

    Raises:
        CacheError: The file is corrupt (the message says to delete it and rerun stage 1) or its info differs.
    """
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            metadata = _checked_metadata(path, handle)
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
        info = json.loads(metadata[_INFO_KEY])
        state = decode_state(tensors, json.loads(metadata[_STRUCTURE_KEY]))
    except CacheError:
        raise
    except (SafetensorError, OSError, KeyError, ValueError, TypeError) as error:
        raise _corrupt(path, error) from error
    if expected_info is not None and info != make_cache_info(expected_info):
        difference = _describe_difference(info, expected_info)
        raise CacheError(f"cache file {path} was made by another stage-1 run: {difference}; delete it and {_RERUN}")
    return state


def _describe_difference(stored: Mapping[str, Any], expected: Mapping[str, Any]) -> str:
    expected = make_cache_info(expected)
    missing = object()
    parts = []
    for field in sorted(set(stored) | set(expected)):
        was, now = stored.get(field, missing), expected.get(field, missing)
        if was != now:
            was = "(absent)" if was is missing else _short(was)
            now = "(absent)" if now is missing else _short(now)
            parts.append(f"{field}: cache has {was}, this run expects {now}")
    return "; ".join(parts)


def _short(value: Any, limit: int = 200) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit] + "..."


def write_cache_info(output_path: str | os.PathLike, info: Mapping[str, Any]) -> Path:
    """Writes ``<output_path>/cache_info.json`` at the start of stage 1; a resumed run must match the existing one.

    Raises:
        CacheError: The folder already holds a cache made with different info; resuming into it would mix samples of
            two models.
    """
    path = Path(output_path) / CACHE_INFO_FILE
    info = make_cache_info(info)
    if path.is_file():
        stored = read_cache_info(output_path)
        if stored != info:
            raise CacheError(
                f"{output_path} already holds a stage-1 cache made with other settings "
                f"({_describe_difference(stored, info)}); choose a fresh --output_path or delete that folder"
            )
        return path
    return atomic_write_json(path, info)


def read_cache_info(folder: str | os.PathLike) -> dict[str, Any]:
    """The info in ``<folder>/cache_info.json``.

    Raises:
        CacheError: The file is missing or is not JSON.
    """
    path = Path(folder) / CACHE_INFO_FILE
    if not path.is_file():
        raise CacheError(f"{folder} has no {CACHE_INFO_FILE}, so it is not a stage-1 cache; run "
                         f"`--task sft:data_process` with --output_path {folder}, or point --dataset_base_path at the "
                         "--output_path of the stage-1 run")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise CacheError(f"{path} is not valid JSON ({error}); delete the cache folder and rerun stage 1") from error


def list_cache_files(folder: str | os.PathLike) -> list[Path]:
    """The cache files under ``folder``, ordered by (sample index, process index) as numbers, not as text.

    Stage 1 names each file by the sample's index in the whole dataset, so this order is the dataset's order however
    many processes wrote the cache, and stage 2 sees the samples one-stage training would.
    """
    found = []
    for path in Path(folder).glob("*/[0-9]*.safetensors"):
        if path.parent.name.isdigit() and path.stem.isdigit():
            found.append((int(path.stem), int(path.parent.name), path))
    return [path for _, _, path in sorted(found)]


def cache_inventory(folder: str | os.PathLike) -> dict[int, list[Path]]:
    """Sample index -> its cache files under ``folder`` (more than one when several process folders hold it)."""
    inventory: dict[int, list[Path]] = {}
    for path in list_cache_files(folder):
        inventory.setdefault(int(path.stem), []).append(path)
    return inventory


def write_cache_manifest(folder: str | os.PathLike, num_samples: int, skipped: Mapping[int, str],
                         command: str | None) -> Path:
    """Writes ``<folder>/cache_manifest.json``: what this stage-1 run caches, for stage 2's completeness check.

    Args:
        folder: The stage-1 ``--output_path``.
        num_samples: The metadata rows; sample indices run from 0 to ``num_samples - 1``.
        skipped: Sample index -> why it is not cached (its file failed to decode under ``--on_bad_sample skip``).
        command: The command line that completes the cache when rerun, quoted for a shell.
    """
    manifest = {"format_version": CACHE_FORMAT_VERSION, "num_samples": num_samples,
                "skipped": {str(index): reason for index, reason in sorted(skipped.items())}, "command": command}
    return atomic_write_json(Path(folder) / CACHE_MANIFEST_FILE, manifest)


def read_cache_manifest(folder: str | os.PathLike) -> dict[str, Any]:
    """``<folder>/cache_manifest.json`` with ``skipped`` keyed by int.

    Raises:
        CacheError: The file is missing or unreadable; the message says to rerun stage 1.
    """
    path = Path(folder) / CACHE_MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        return {**manifest, "num_samples": int(manifest["num_samples"]),
                "skipped": {int(index): reason for index, reason in manifest["skipped"].items()}}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise CacheError(f"{path} is missing or unreadable ({type(error).__name__}: {error}), so nobody knows which "
                         f"samples the cache in {folder} should hold; rerun `--task sft:data_process` with "
                         f"--output_path {folder}, which keeps what is cached and completes the rest") from error


class CacheDataset(Dataset):
    """The samples of a stage-1 cache, read lazily for stage 2.

    At construction the cache must be complete: every sample the manifest's stage-1 run was asked for (all metadata
    rows but those it skipped as undecodable) has its file. Only file names are listed; no file is opened.

    Args:
        folder: The stage-1 ``--output_path`` (given to stage 2 as ``--dataset_base_path``).
        expected_info: What this run needs the cache to have been made with (``make_cache_info`` fields); None
            accepts any cache.
        repeat: How many times each sample appears per epoch (``--dataset_repeat``).
        allow_partial: Train on the samples present when some are missing (``--allow_partial_cache``), with a
            warning, instead of refusing.

    Raises:
        DataFileNotFoundError: ``folder`` does not exist.
        CacheError: No ``cache_info.json`` or manifest, no cache files, the stored info differs from
            ``expected_info``, a sample has two files or lies beyond the manifest's count, or (unless
            ``allow_partial``) samples are missing; the message says how many and the command that completes them.
    """

    def __init__(self, folder: str | os.PathLike, expected_info: Mapping[str, Any] | None = None,
                 repeat: int = 1, allow_partial: bool = False) -> None:
        check_repeat(repeat)
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise DataFileNotFoundError(f"--dataset_base_path {folder} is not a folder; for --task sft:train point it "
                                        "at the --output_path of the `--task sft:data_process` run")
        self.info = read_cache_info(self.folder)
        if expected_info is not None:
            self.check_info(expected_info)
        self.manifest = read_cache_manifest(self.folder)
        inventory = cache_inventory(self.folder)
        if not inventory:
            raise CacheError(f"{folder} has no cache files (<process>/<sample>.safetensors); stage 1 has not finished "
                             f"a sample there: {self._completion_hint()}")
        self._check_layout(inventory)
        self.missing = [index for index in range(self.manifest["num_samples"])
                        if index not in inventory and index not in self.manifest["skipped"]]
        if self.missing:
            self._report_missing(len(inventory), allow_partial)
        self.files = [paths[0] for _, paths in sorted(inventory.items())]
        self.repeat = repeat

    def _check_layout(self, inventory: Mapping[int, list[Path]]) -> None:
        doubled = {index: paths for index, paths in inventory.items() if len(paths) > 1}
        beyond = [paths[0] for index, paths in inventory.items() if index >= self.manifest["num_samples"]]
        if doubled or beyond:
            example = next(iter(doubled.values()), beyond)
            raise CacheError(
                f"{self.folder} holds files that no stage-1 run of its manifest wrote ({len(doubled)} sample(s) in two "
                f"process folders, {len(beyond)} beyond its {self.manifest['num_samples']} samples; e.g. "
                f"{', '.join(map(str, example[:2]))}); rerun stage 1, which removes them: {self._completion_hint()}"
            )

    def _report_missing(self, present: int, allow_partial: bool) -> None:
        expected = self.manifest["num_samples"] - len(self.manifest["skipped"])
        rows = ", ".join(str(index + 1) for index in self.missing[:5]) + (", ..." if len(self.missing) > 5 else "")
        summary = (f"the stage-1 cache in {self.folder} is incomplete: {len(self.missing)} of its {expected} samples "
                   f"are missing (metadata rows {rows})")
        if allow_partial:
            logger.warning("%s; --allow_partial_cache: training on the %d samples present", summary, present)
            return
        raise CacheError(f"{summary}. Complete it with {self._completion_hint()}; or pass --allow_partial_cache to "
                         f"train on the {present} samples present")

    def _completion_hint(self) -> str:
        command = self.manifest.get("command")
        if command:
            return f"the stage-1 command, which computes only what is missing: {command}"
        return f"`--task sft:data_process` and --output_path {self.folder}, which computes only what is missing"

    def check_info(self, expected_info: Mapping[str, Any]) -> None:
        """Refuses a cache made with other info than ``expected_info`` (another model, other stage-2 units).

        Raises:
            CacheError: Names the fields that differ and the fix.
        """
        if self.info != make_cache_info(expected_info):
            raise CacheError(f"the cache in {self.folder} does not fit this run: "
                             f"{_describe_difference(self.info, expected_info)}; {_RERUN}")

    def __len__(self) -> int:
        return len(self.files) * self.repeat

    def describe_sample(self, index: int) -> str:
        """Where sample ``index`` comes from, for messages: its cache file."""
        return f"cache file {self.files[index % len(self.files)]}"

    def tensor_shapes(self, index: int) -> dict[str, tuple[int, ...]]:
        """The shape of every tensor of sample ``index`` by its name in the file (``shared/input_latents``), read from
        the file's header only (for batching samples of one shape)."""
        path = self.files[index % len(self.files)]
        try:
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                _checked_metadata(path, handle)
                return {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}
        except CacheError:
            raise
        except (SafetensorError, OSError, KeyError, ValueError, TypeError) as error:
            raise _corrupt(path, error) from error

    def __getitem__(self, index: int) -> dict[str, Any]:
        """The state ``{"shared", "posi", "nega"}`` of file ``index % files``, tensors on the CPU."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} is out of range for a cache of {len(self)} samples")
        return load_cache_sample(self.files[index % len(self.files)], expected_info=self.info)
