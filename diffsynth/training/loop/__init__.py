"""The recipe of a task stage and what it calls each step: the optimizer, the non-finite guard, preemption,
progress, and samples while training."""

from typing import TYPE_CHECKING

from ...core.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    ".runner": ("launch_training_task",),
    ".stage_one": ("launch_data_process_task",),
})

if TYPE_CHECKING:
    from .runner import launch_training_task
    from .stage_one import launch_data_process_task

__all__ = ["launch_data_process_task", "launch_training_task"]
