"""What a run writes and reads back: the output folder and its lock, LoRA files and logs, training-state
checkpoints, the loss chart, and initial weights."""

from typing import TYPE_CHECKING

from ...core.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    ".checkpoint": ("load_training_state",),
    ".logger": ("ModelLogger",),
    ".output_folder": ("OutputClaim", "claim_output_folder"),
})

if TYPE_CHECKING:
    from .checkpoint import load_training_state
    from .logger import ModelLogger
    from .output_folder import OutputClaim, claim_output_folder

__all__ = ["ModelLogger", "OutputClaim", "claim_output_folder", "load_training_state"]
