"""What a run learns: the training module (freezing, LoRA, the units of a task stage), the losses, timestep
sampling, and batches."""

from .loss import DirectDistillLoss, FlowMatchSFTLoss
from .timestep_sampling import TimestepSampling
from .training_module import DiffusionTrainingModule

__all__ = ["DiffusionTrainingModule", "DirectDistillLoss", "FlowMatchSFTLoss", "TimestepSampling"]
