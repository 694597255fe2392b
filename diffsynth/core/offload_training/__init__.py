"""Offload training: weights in host memory, moved to the compute device one unit at a time."""

from .manager import OffloadTrainingConfig, OffloadTrainingManager, OffloadUnit
from .memory_buffer import (ALIGNMENT, BaseBufferPool, PinnedArenaPool, PinnedBuffer, per_tensor_pinned_bytes,
                            plan_arena)
from .offloader import (AlwaysOnDeviceParamOffloader, BufferOffloader, ResidencyMeter, StaticParamOffloader,
                        TensorOffloader, TrainableParamOffloader)
from .placement import UnitSpec, plan_units

__all__ = [
    "ALIGNMENT", "AlwaysOnDeviceParamOffloader", "BaseBufferPool", "BufferOffloader", "OffloadTrainingConfig",
    "OffloadTrainingManager", "OffloadUnit", "PinnedArenaPool", "PinnedBuffer", "ResidencyMeter",
    "StaticParamOffloader", "TensorOffloader", "TrainableParamOffloader", "UnitSpec", "per_tensor_pinned_bytes",
    "plan_arena", "plan_units",
]
