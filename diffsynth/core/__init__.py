"""Model-agnostic machinery: offload training, gradient checkpointing, device helpers."""

from .gradient import gradient_checkpoint_forward
from .offload_training import OffloadTrainingConfig, OffloadTrainingManager, PinnedArenaPool

__all__ = ["OffloadTrainingConfig", "OffloadTrainingManager", "PinnedArenaPool", "gradient_checkpoint_forward"]
