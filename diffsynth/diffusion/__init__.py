"""The training framework: pipelines built from units, the stage split, and (later) losses and runners."""

from .base_pipeline import (SCOPES, BasePipeline, PipelineUnit, PipelineUnitRunner, PruneCacheUnit, StateKey,
                            UnitAccess, required_cache_keys, split_pipeline_units, stage_one_units, unit_access)

__all__ = ["SCOPES", "BasePipeline", "PipelineUnit", "PipelineUnitRunner", "PruneCacheUnit", "StateKey",
           "UnitAccess", "required_cache_keys", "split_pipeline_units", "stage_one_units", "unit_access"]
