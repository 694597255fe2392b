"""Training data: ``UnifiedDataset`` over a metadata file, the file operators, and the stage-1 cache.

Typical use::

    dataset = UnifiedDataset("data/example", "data/example/metadata.csv", repeat=50, max_pixels=1024 * 1024)
    sample = dataset[0]  # {"image": PIL.Image, "prompt": "..."}
    videos = UnifiedDataset("data/clips", "data/clips/metadata.csv", num_frames=49)
    sample = videos[0]  # {"video": [PIL.Image] * 49, "prompt": "..."}

Stage 1 of split training writes each sample's state with ``save_cache_sample`` to ``cache_file_path(...)``,
with the sample's fingerprint (``fingerprint``); a rerun settles the folder first (``cache_sync``). Stage 2 reads the
samples back through ``CacheDataset``, which refuses an incomplete cache. Undecodable files: ``bad_samples``. The
example-dataset builder lives in ``diffsynth.core.data.example_dataset`` (imported on demand, so ``python -m`` can run
it without a warning).
"""

from typing import TYPE_CHECKING

from ..lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    ".bad_samples": ("ON_BAD_SAMPLE_CHOICES", "BadSample", "BadSampleError"),
    ".cache": ("CACHE_FORMAT_VERSION", "CACHE_INFO_FILE", "CACHE_MANIFEST_FILE", "CacheDataset", "cache_file_path",
               "cache_inventory", "list_cache_files", "load_cache_sample", "make_cache_info", "read_cache_fingerprint",
               "read_cache_info", "read_cache_manifest", "save_cache_sample", "write_cache_info",
               "write_cache_manifest"),
    ".cache_codec": ("STATE_KEYS", "decode_state", "encode_state"),
    ".cache_sync": ("CacheSync", "sync_stage_one_cache"),
    ".dataset": ("CheckedDataset", "UnifiedDataset", "check_dataset", "check_repeat", "read_metadata"),
    ".errors": ("CacheError", "DataFileNotFoundError", "DatasetError"),
    ".fingerprint": ("FileIdentity", "SampleFingerprint"),
    ".operators": ("FILE_OPERATORS", "FileOperator", "ResizeConfig", "operator_for", "resize_and_crop"),
    ".video": ("DEFAULT_NUM_FRAMES", "VIDEO_EXTENSIONS", "LoadVideo", "check_num_frames", "probe_video"),
})

if TYPE_CHECKING:
    from .bad_samples import ON_BAD_SAMPLE_CHOICES, BadSample, BadSampleError
    from .cache import (
                        CACHE_FORMAT_VERSION,
                        CACHE_INFO_FILE,
                        CACHE_MANIFEST_FILE,
                        CacheDataset,
                        cache_file_path,
                        cache_inventory,
                        list_cache_files,
                        load_cache_sample,
                        make_cache_info,
                        read_cache_fingerprint,
                        read_cache_info,
                        read_cache_manifest,
                        save_cache_sample,
                        write_cache_info,
                        write_cache_manifest,
    )
    from .cache_codec import STATE_KEYS, decode_state, encode_state
    from .cache_sync import CacheSync, sync_stage_one_cache
    from .dataset import CheckedDataset, UnifiedDataset, check_dataset, check_repeat, read_metadata
    from .errors import CacheError, DataFileNotFoundError, DatasetError
    from .fingerprint import FileIdentity, SampleFingerprint
    from .operators import FILE_OPERATORS, FileOperator, ResizeConfig, operator_for, resize_and_crop
    from .video import DEFAULT_NUM_FRAMES, VIDEO_EXTENSIONS, LoadVideo, check_num_frames, probe_video

__all__ = [
    "CACHE_FORMAT_VERSION",
    "CACHE_INFO_FILE",
    "CACHE_MANIFEST_FILE",
    "DEFAULT_NUM_FRAMES",
    "FILE_OPERATORS",
    "ON_BAD_SAMPLE_CHOICES",
    "STATE_KEYS",
    "VIDEO_EXTENSIONS",
    "BadSample",
    "BadSampleError",
    "CacheDataset",
    "CacheError",
    "CacheSync",
    "CheckedDataset",
    "DataFileNotFoundError",
    "DatasetError",
    "FileIdentity",
    "FileOperator",
    "LoadVideo",
    "ResizeConfig",
    "SampleFingerprint",
    "UnifiedDataset",
    "cache_file_path",
    "cache_inventory",
    "check_dataset",
    "check_num_frames",
    "check_repeat",
    "decode_state",
    "encode_state",
    "list_cache_files",
    "load_cache_sample",
    "make_cache_info",
    "operator_for",
    "probe_video",
    "read_cache_fingerprint",
    "read_cache_info",
    "read_cache_manifest",
    "read_metadata",
    "resize_and_crop",
    "save_cache_sample",
    "sync_stage_one_cache",
    "write_cache_info",
    "write_cache_manifest",
]
