"""Model-agnostic machinery: offload training, fp8 weight storage, gradient checkpointing, model loading, data,
device helpers."""

from typing import TYPE_CHECKING

from .lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    ".data": ("CacheDataset", "UnifiedDataset"),
    ".fp8": ("Fp8Linear", "Fp8Storage", "Fp8StorageConfig", "enable_fp8_storage", "nbytes_by_dtype"),
    ".gradient": ("gradient_checkpoint_forward",),
    ".loader": ("ModelConfig", "load_model", "load_tokenizer", "parse_model_id_with_origin_paths", "parse_model_paths",
                "resolve_files"),
    ".offload_training": ("OffloadTrainingConfig", "OffloadTrainingManager", "PinnedArenaPool"),
})

if TYPE_CHECKING:
    from .data import CacheDataset, UnifiedDataset
    from .fp8 import Fp8Linear, Fp8Storage, Fp8StorageConfig, enable_fp8_storage, nbytes_by_dtype
    from .gradient import gradient_checkpoint_forward
    from .loader import (
                         ModelConfig,
                         load_model,
                         load_tokenizer,
                         parse_model_id_with_origin_paths,
                         parse_model_paths,
                         resolve_files,
    )
    from .offload_training import OffloadTrainingConfig, OffloadTrainingManager, PinnedArenaPool

__all__ = [
    "CacheDataset", "Fp8Linear", "Fp8Storage", "Fp8StorageConfig", "ModelConfig", "OffloadTrainingConfig",
    "OffloadTrainingManager", "PinnedArenaPool", "UnifiedDataset", "enable_fp8_storage", "gradient_checkpoint_forward",
    "load_model", "load_tokenizer", "nbytes_by_dtype", "parse_model_id_with_origin_paths",
    "parse_model_paths", "resolve_files",
]
