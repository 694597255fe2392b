"""Offload training: weights in host memory, moved to the compute device one unit (or one block) at a time.

One residency driver (``hooks.py``) observes forward, recompute and backward; policies decide what moves: per-leaf
offload with prefetch (``OffloadTrainingManager``), classic block swap and the H2D-only ring (``create_offloader``).
"""

from .block_swap import BlockSwap, BlockSwapConfig, create_offloader, find_block_list, streaming_block_indices
from .classic_swap import ClassicBlockSwap
from .device_pool import DeviceBufferPool, DevicePoolStats, PooledBuffer
from .h2d_stream import H2DOnlyBlockSwap
from .hooks import ResidencyDriver, ResidencyMeter, ResidencyPolicy
from .leaf_offload import LeafOffloadPolicy, OffloadUnit
from .manager import OffloadTrainingConfig, OffloadTrainingManager
from .memory_buffer import ALIGNMENT, BaseBufferPool, PinnedArenaPool, PinnedBuffer, per_tensor_pinned_bytes, plan_arena
from .offloader import (
                            AlwaysOnDeviceParamOffloader,
                            BufferOffloader,
                            StaticParamOffloader,
                            TensorOffloader,
                            TrainableParamOffloader,
)
from .placement import UnitSpec, plan_units
from .prefetch import PrefetchScheduler, PrefetchStats
from .transfer import DirectEngine, StagedEngine, SyncEngine, TransferEngine, TransferTimer, make_engine

__all__ = [
    "ALIGNMENT", "AlwaysOnDeviceParamOffloader", "BaseBufferPool", "BlockSwap", "BlockSwapConfig", "BufferOffloader",
    "ClassicBlockSwap", "DeviceBufferPool", "DevicePoolStats", "DirectEngine", "H2DOnlyBlockSwap",
    "LeafOffloadPolicy", "OffloadTrainingConfig", "OffloadTrainingManager", "OffloadUnit", "PinnedArenaPool",
    "PinnedBuffer", "PooledBuffer", "PrefetchScheduler", "PrefetchStats", "ResidencyDriver", "ResidencyMeter", "ResidencyPolicy",
    "StagedEngine", "StaticParamOffloader", "SyncEngine", "TensorOffloader", "TrainableParamOffloader",
    "TransferEngine", "TransferTimer", "UnitSpec", "create_offloader", "find_block_list", "make_engine",
    "per_tensor_pinned_bytes", "plan_arena", "plan_units", "streaming_block_indices",
]
