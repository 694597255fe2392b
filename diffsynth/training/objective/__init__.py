"""What a run learns: the training module (freezing, LoRA, the units of a task stage), the losses, timestep
sampling, and batches."""

from typing import TYPE_CHECKING

from ...core.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    ".loss": ("DirectDistillLoss", "FlowMatchSFTLoss"),
    ".timestep_sampling": ("TimestepSampling",),
    ".training_module": ("DiffusionTrainingModule",),
})

if TYPE_CHECKING:
    from .loss import DirectDistillLoss, FlowMatchSFTLoss
    from .timestep_sampling import TimestepSampling
    from .training_module import DiffusionTrainingModule

__all__ = ["DiffusionTrainingModule", "DirectDistillLoss", "FlowMatchSFTLoss", "TimestepSampling"]
