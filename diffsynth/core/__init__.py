"""Model-agnostic machinery: offload training, gradient checkpointing, model loading, data, LoRA, device helpers."""

from .data import CacheDataset, UnifiedDataset
from .gradient import gradient_checkpoint_forward
from .loader import (ModelConfig, load_model, load_tokenizer, parse_model_id_with_origin_paths, parse_model_paths,
                     resolve_files)
from .lora import load_lora
from .offload_training import OffloadTrainingConfig, OffloadTrainingManager, PinnedArenaPool

__all__ = [
    "CacheDataset", "ModelConfig", "OffloadTrainingConfig", "OffloadTrainingManager", "PinnedArenaPool",
    "UnifiedDataset", "gradient_checkpoint_forward", "load_lora", "load_model", "load_tokenizer",
    "parse_model_id_with_origin_paths", "parse_model_paths", "resolve_files",
]
