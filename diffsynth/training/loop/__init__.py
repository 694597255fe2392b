"""The recipe of a task stage and what it calls each step: the optimizer, the non-finite guard, preemption,
progress, and samples while training."""

from .runner import launch_training_task
from .stage_one import launch_data_process_task

__all__ = ["launch_data_process_task", "launch_training_task"]
