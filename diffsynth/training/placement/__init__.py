"""Where a run's weights live: the placement config, the memory planner, one host copy per machine, quantized and
DeepSpeed-partitioned weights."""

from typing import TYPE_CHECKING

from ...core.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "..config.placement": ("PlacementConfig", "PlacementError"),
})

if TYPE_CHECKING:
    from ..config.placement import PlacementConfig, PlacementError

__all__ = ["PlacementConfig", "PlacementError"]
