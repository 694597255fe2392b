"""The run's dataset: the stage-1 cache, or the metadata rows with every referenced file checked before any model
loads; several datasets and regularization images make a ``DatasetMix`` (docs Datasets)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...core.data import DEFAULT_NUM_FRAMES, CacheDataset, UnifiedDataset
from ...core.data.bad_samples import STARTUP_DECODE_PIXELS, bad_samples_error
from ...core.data.errors import CacheError, DataFileNotFoundError, DatasetError, MissingColumnsError
from ...core.data.mix import DatasetMix, MixPart, read_mix_manifest
from ...diffusion.base_pipeline import BasePipeline
from ..config.dataset_entries import DatasetEntry
from ..config.errors import FlagError
from ..config.validation_loss import VALIDATION_CACHE_DIR
from .input_checks import warn_about_unread_columns
from .masks import check_dataset_masks, optional_file_columns

if TYPE_CHECKING:
    from ..config import RunConfig

logger = logging.getLogger(__name__)


def build_dataset(config: RunConfig, pipeline_class: type[BasePipeline], accelerator: Any
                  ) -> CacheDataset | UnifiedDataset | DatasetMix:
    """The stage-1 cache for ``*:train``; otherwise the metadata dataset (several, with regularization images: a
    ``DatasetMix``), decoded once at start-up when small."""
    dataset = config.dataset
    if config.training.stage == "train":
        return build_cached_dataset(config)
    if dataset.mixed:
        return build_mix(config, pipeline_class, accelerator)
    raw = build_raw_dataset(config, pipeline_class)
    decode_at_startup(accelerator, raw, dataset.on_bad_sample)
    return raw


def build_raw_dataset(config: RunConfig, pipeline_class: type[BasePipeline],
                      entry: DatasetEntry | None = None) -> UnifiedDataset:
    """The metadata dataset, with every referenced file checked (headers only) before any model loads.

    Stage 1 caches each row once: repeats would only write identical files, and stage 2 applies its own
    ``--dataset_repeat``. Its samples keep their row numbers, which name the cache files. ``entry`` names another set
    read like the training set but without repeats (a validation set, or one dataset of a mix, which repeats its
    rows itself); its unset sizes and columns are the run's.

    Raises:
        FlagError: An extra input the pipeline reads as images (``edit_image``) is missing from ``--data_file_keys``.
        DatasetError: A file or row is unusable; a video dataset given to an image model's trainer says which
            trainer takes videos.
    """
    flags, extra_inputs = config.dataset, config.model.extra_input_names
    training_set = entry is None
    repeat = flags.dataset_repeat if training_set else 1
    entry = entry or flags.entries()[0]
    unloaded = [name for name in extra_inputs if name in pipeline_class.image_inputs and name not in entry.file_keys]
    if unloaded:
        raise FlagError([f"--extra_inputs {name} takes images, but --data_file_keys {entry.data_file_keys!r} leaves "
                         f"the {name} column as paths; add it, e.g. --data_file_keys image,{name}"
                         for name in unloaded])
    caching = config.training.stage == "data_process"
    optional = (*optional_file_columns(config), *pipeline_class.optional_inputs)
    if caching and repeat > 1:
        logger.warning("--dataset_repeat %d is ignored by --task %s: each sample is cached once; pass the repeat "
                       "to the training stage", repeat, config.training.task)
        repeat = 1
    try:
        dataset = UnifiedDataset(
            entry.base_path, entry.metadata_path, repeat=repeat, data_file_keys=entry.file_keys,
            height=entry.height, width=entry.width, max_pixels=entry.max_pixels,
            required_columns=pipeline_class.required_columns(extra_inputs),
            num_frames=DEFAULT_NUM_FRAMES if entry.num_frames is None else entry.num_frames,
            allow_shorter_videos=flags.allow_shorter_videos, on_bad_sample=flags.on_bad_sample,
            keep_row_indices=caching, buckets=flags.bucketed, optional_file_keys=optional,
            optional_columns=pipeline_class.optional_columns,
            keep_alpha=any(name in pipeline_class.alpha_inputs for name in extra_inputs),
            paired_lists=[pair for pair in pipeline_class.paired_list_inputs if set(pair) <= set(extra_inputs)],
            column_types={name: pipeline_class.input_types[name] for name in extra_inputs
                          if name in pipeline_class.input_types},
        )  # fmt: skip
    except MissingColumnsError as error:
        # Renaming the video column would not help: this model trains on images, and videos need the video trainer.
        if "image" in error.missing and "video" in error.found:
            raise DatasetError(f"metadata {entry.metadata_path} lists videos (column 'video'), but this "
                               f"trainer ({pipeline_class.__name__}) trains on images (column 'image'); train on "
                               "videos with the Wan trainer, examples/wanvideo/model_training/train.py, or give this "
                               "one a dataset of images") from None
        raise
    warn_about_unread_columns(config, pipeline_class, {column for row in dataset.rows for column in row})
    # A validation set, or one dataset of a mix (regularization images), may have no masks.
    check_dataset_masks(config, dataset, pipeline_class, require_one=training_set)
    return dataset


def _entry_names(config: RunConfig) -> list[str]:
    """How messages name each of ``config.dataset.entries()``: the config key or the flag that gave it."""
    flags = config.dataset
    names = [f"datasets[{index}]" for index in range(len(flags.datasets))] or ["--dataset_metadata_path"]
    return names + (["--reg_dataset_metadata_path"] if flags.reg_dataset_metadata_path is not None else [])


def build_mix(config: RunConfig, pipeline_class: type[BasePipeline], accelerator: Any) -> DatasetMix:
    """The datasets of ``datasets:`` and ``--reg_dataset_metadata_path`` as one ``DatasetMix``, each checked and
    decoded at start-up like a single dataset; every missing metadata file or folder is reported before any is
    read.

    Raises:
        FlagError: Missing files or folders, or an unusable dataset; each message names its config key or flag.
    """
    entries, names = config.dataset.entries(), _entry_names(config)
    missing = []
    for name, entry in zip(names, entries):
        if not Path(entry.metadata_path).is_file():
            missing.append(f"{name}: the metadata file {entry.metadata_path} does not exist; pass the dataset's "
                           ".csv / .json / .jsonl")
        if not Path(entry.base_path or ".").is_dir():
            missing.append(f"{name}: the folder {entry.base_path} ({entry.metadata_path}'s files) does not exist; "
                           "pass the folder its file paths are relative to")
    if missing:
        raise FlagError(missing)
    parts = []
    for name, entry in zip(names, entries):
        try:
            part = build_raw_dataset(config, pipeline_class, entry)
            decode_at_startup(accelerator, part, config.dataset.on_bad_sample)
        except (DatasetError, DataFileNotFoundError) as error:
            raise FlagError([f"{name} ({entry.metadata_path}): {error}"]) from None
        parts.append(MixPart(part, entry.repeats, entry.is_reg, f"{name} ({entry.metadata_path})"))
    return _mix(parts, config, accelerator)


def build_cached_dataset(config: RunConfig) -> CacheDataset | DatasetMix:
    """The stage-1 cache in ``--dataset_base_path``: one dataset's, or (``datasets.json``) the caches of a mix's
    datasets with the repeats and regularization marks stage 1 recorded.

    Raises:
        FlagError: ``--prior_loss_weight`` is set but the cache holds no regularization rows.
        CacheError: See ``CacheDataset``.
    """
    flags = config.dataset
    recorded = read_mix_manifest(flags.dataset_base_path)
    if recorded is None:
        dataset: CacheDataset | DatasetMix = CacheDataset(flags.dataset_base_path, repeat=flags.dataset_repeat,
                                                          allow_partial=flags.allow_partial_cache)
    else:
        parts = [MixPart(CacheDataset(entry["folder"], allow_partial=flags.allow_partial_cache), entry["repeats"],
                         entry["is_reg"], entry["name"]) for entry in recorded]
        dataset = _mix(parts, config, None)
    if flags.prior_loss_weight != 1.0 and not (isinstance(dataset, DatasetMix) and dataset.has_reg):
        raise FlagError([(f"--prior_loss_weight {flags.prior_loss_weight}: the stage-1 cache in --dataset_base_path "
                         f"{flags.dataset_base_path} holds no regularization rows; rerun stage 1 with "
                         "--reg_dataset_metadata_path, or drop --prior_loss_weight")])
    return dataset


def _mix(parts: list[MixPart], config: RunConfig, accelerator: Any) -> DatasetMix:
    """The mix of ``parts`` (repeats times ``--dataset_repeat``), its summary logged on the main process."""
    flags = config.dataset
    mix = DatasetMix(parts, multiplier=1 if config.training.stage == "data_process" else flags.dataset_repeat)
    if accelerator is None or accelerator.is_main_process:
        logger.info("dataset: %s", mix.summary())
    return mix


def build_validation_dataset(config: RunConfig, pipeline_class: type[BasePipeline], accelerator: Any
                             ) -> CacheDataset | UnifiedDataset | None:
    """The validation set of ``--validation_dataset_metadata_path`` (checked like the training set), or for
    ``*:train`` its stage-1 cache in ``<validation_dataset_base_path>/validation``; None when the run measures no
    validation loss.

    Raises:
        FlagError: The set is missing or empty, lacks the training set's columns, has unusable files, or (for
            ``*:train``) its cache is missing or incomplete; the message names the flag, the value and the fix.
    """
    flags, dataset = config.validation_loss, config.dataset
    base_path = flags.base_path(dataset.dataset_base_path)
    if config.training.stage == "train":
        if not flags.measured:
            return None
        folder = Path(base_path) / VALIDATION_CACHE_DIR
        given = ("--validation_dataset_base_path" if flags.validation_dataset_base_path else "--dataset_base_path")
        if not folder.is_dir():
            raise FlagError([f"--validation_loss_steps {flags.validation_loss_steps}: {given} {base_path} holds no "
                             f"cached validation set ({folder} is missing); run the {config.training.family}:"
                             "data_process stage with --validation_dataset_metadata_path FILE, or pass "
                             "--validation_dataset_base_path the stage-1 output that holds one, or drop "
                             "--validation_loss_steps"])
        try:
            return CacheDataset(folder, allow_partial=dataset.allow_partial_cache)
        except (CacheError, DataFileNotFoundError) as error:
            raise FlagError([f"the cached validation set in {folder}: {error}"]) from None
    metadata = flags.validation_dataset_metadata_path
    if metadata is None:
        return None
    if not Path(metadata).is_file():
        raise FlagError([f"--validation_dataset_metadata_path {metadata} does not exist; pass the validation set's "
                         "metadata file (.csv, .json or .jsonl, with the training set's columns)"])
    if not Path(base_path).is_dir():
        flag = "--validation_dataset_base_path" if flags.validation_dataset_base_path else "--dataset_base_path"
        raise FlagError([f"{flag} {base_path} (the validation set's folder) is not a folder; pass "
                         "--validation_dataset_base_path, the folder the validation metadata's paths are relative to"])
    try:
        validation = build_raw_dataset(config, pipeline_class, dataset.resolve(DatasetEntry(metadata, base_path)))
        decode_at_startup(accelerator, validation, dataset.on_bad_sample)
    except MissingColumnsError as error:
        raise FlagError([f"--validation_dataset_metadata_path {metadata}: {error}; the validation set needs the "
                         f"columns the training set has ({', '.join(error.missing)} missing)"]) from None
    except (DatasetError, DataFileNotFoundError) as error:
        raise FlagError([f"--validation_dataset_metadata_path {metadata}: {error}"]) from None
    if not len(validation):
        raise FlagError([f"--validation_dataset_metadata_path {metadata}: every sample was skipped as undecodable; "
                         "fix the files, or drop the validation set"])
    return validation


def decode_at_startup(accelerator: Any, dataset: UnifiedDataset, on_bad_sample: str) -> None:
    """Decodes every data file once before the models load, when the dataset is small enough (see ``bad_samples``).

    Each process decodes every ``num_processes``-th row and all share what they found, so every process leaves out
    the same rows under ``--on_bad_sample skip``.

    Raises:
        DatasetError: Some files fail to decode and ``on_bad_sample`` is ``stop``; the message names rows and files.
    """
    from accelerate.utils import gather_object

    if dataset.decode_pixels > STARTUP_DECODE_PIXELS:
        logger.info("the dataset decodes to %.1f gigapixels, more than the %.1f checked at start-up: each file is "
                    "decoded (and checked) when first read", dataset.decode_pixels / 1e9, STARTUP_DECODE_PIXELS / 1e9)
        return
    rows = range(accelerator.process_index, len(dataset.rows), accelerator.num_processes)
    bad = sorted(gather_object(dataset.find_bad_rows(rows)), key=lambda sample: sample.index)
    if not bad:
        return
    if on_bad_sample == "stop":
        raise bad_samples_error(bad, str(dataset.metadata_path))
    for sample in bad:
        logger.warning("skipping sample %s (--on_bad_sample skip)", sample.describe())
    logger.warning("%d of %d samples skipped at start-up: their files fail to decode", len(bad), len(dataset.rows))
    dataset.exclude(bad)
