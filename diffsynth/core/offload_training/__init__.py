"""Offload training: weights in host memory, moved to the compute device one unit (or one block) at a time."""

from .block_swap import (BlockSwap, BlockSwapConfig, ClassicBlockSwap, create_offloader, find_block_list,
                         streaming_block_indices)
from .device_pool import DeviceBufferPool, DevicePoolStats
from .h2d_stream import H2DOnlyBlockSwap
from .manager import OffloadTrainingConfig, OffloadTrainingManager, OffloadUnit
from .memory_buffer import (ALIGNMENT, BaseBufferPool, PinnedArenaPool, PinnedBuffer, per_tensor_pinned_bytes,
                            plan_arena)
from .offloader import (AlwaysOnDeviceParamOffloader, BufferOffloader, ResidencyMeter, StaticParamOffloader,
                        TensorOffloader, TrainableParamOffloader)
from .placement import UnitSpec, plan_units
from .prefetch import CopyNowEngine, PrefetchScheduler, PrefetchStats
from .transfer import DirectEngine, StagedEngine, SyncEngine, TransferEngine, TransferTimer, make_engine

__all__ = [
    "ALIGNMENT", "AlwaysOnDeviceParamOffloader", "BaseBufferPool", "BlockSwap", "BlockSwapConfig",
    "BufferOffloader", "ClassicBlockSwap", "CopyNowEngine", "DeviceBufferPool", "DevicePoolStats", "DirectEngine", "H2DOnlyBlockSwap", "OffloadTrainingConfig",
    "OffloadTrainingManager", "OffloadUnit", "PinnedArenaPool", "PinnedBuffer", "PrefetchScheduler",
    "PrefetchStats", "ResidencyMeter", "StagedEngine",
    "StaticParamOffloader", "SyncEngine", "TensorOffloader", "TrainableParamOffloader", "TransferEngine",
    "TransferTimer", "UnitSpec", "create_offloader", "find_block_list", "make_engine", "per_tensor_pinned_bytes",
    "plan_arena", "plan_units", "streaming_block_indices",
]
