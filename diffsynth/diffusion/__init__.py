"""The pipeline framework that inference and training share: units, the unit graph and its stage split, the
pipeline base class and the flow-matching schedule. The trainer is :mod:`diffsynth.training`."""

from typing import TYPE_CHECKING

from ..core.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    ".base_pipeline": ("SCOPES", "BasePipeline", "PipelineUnit", "PipelineUnitRunner", "PruneCacheUnit", "StateKey",
                       "UnitAccess", "required_cache_keys", "split_pipeline_units", "stage_one_units", "unit_access"),
    ".flow_match": ("FlowMatchScheduler",),
})

if TYPE_CHECKING:
    from .base_pipeline import (
                                SCOPES,
                                BasePipeline,
                                PipelineUnit,
                                PipelineUnitRunner,
                                PruneCacheUnit,
                                StateKey,
                                UnitAccess,
                                required_cache_keys,
                                split_pipeline_units,
                                stage_one_units,
                                unit_access,
    )
    from .flow_match import FlowMatchScheduler

__all__ = ["SCOPES", "BasePipeline", "FlowMatchScheduler", "PipelineUnit", "PipelineUnitRunner", "PruneCacheUnit",
           "StateKey", "UnitAccess", "required_cache_keys", "split_pipeline_units", "stage_one_units", "unit_access"]
