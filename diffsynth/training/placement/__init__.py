"""Where a run's weights live: the placement config, the memory planner, one host copy per machine, quantized and
DeepSpeed-partitioned weights."""

from .config import PlacementConfig, PlacementError

__all__ = ["PlacementConfig", "PlacementError"]
