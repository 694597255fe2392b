"""The training framework: pipelines built from units, the stage split, losses, the training module and the runner.

The trainer entry (``trainer.main``, and ``trainer.cli``, which runs it and exits with the code of its outcome), the
runner and the logger import accelerate lazily through their own modules; import them from there
(``from diffsynth.diffusion.trainer import main``).
"""

from .base_pipeline import (SCOPES, BasePipeline, PipelineUnit, PipelineUnitRunner, PruneCacheUnit, StateKey,
                            UnitAccess, required_cache_keys, split_pipeline_units, stage_one_units, unit_access)
from .flow_match import FlowMatchScheduler
from .loss import DirectDistillLoss, FlowMatchSFTLoss
from .training_module import DiffusionTrainingModule

__all__ = ["SCOPES", "BasePipeline", "DiffusionTrainingModule", "DirectDistillLoss", "FlowMatchSFTLoss",
           "FlowMatchScheduler", "PipelineUnit", "PipelineUnitRunner", "PruneCacheUnit", "StateKey", "UnitAccess",
           "required_cache_keys", "split_pipeline_units", "stage_one_units", "unit_access"]
