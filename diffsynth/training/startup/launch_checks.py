"""The launch-time checks: the flags against what this launch is (its accelerator, its processes, DeepSpeed or
not), which the flags alone cannot tell. They run once the accelerator exists and before any model loads; the
checks of the flags alone run when they parse (``config``), those against the pipeline and its files in the other
``startup`` modules."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..loop.fused_step import process_problems as fused_step_process_problems
from ..placement.deepspeed import deepspeed_config, deepspeed_problems, gradient_clipping_problems

if TYPE_CHECKING:
    from ..config import RunConfig


def launch_problems(config: RunConfig, accelerator: Any) -> list[str]:
    """Every problem of running ``config`` under ``accelerator``, each naming the flag, the value and the fix: the
    flags DeepSpeed cannot run with and a ``--max_grad_norm`` its config contradicts (under a DeepSpeed launch), and
    a ``--fused_optimizer_step`` launched in more than one process."""
    problems = []
    if (zero_config := deepspeed_config(accelerator)) is not None:
        problems += deepspeed_problems(config.placement, config.model, config.validation, config.training)
        problems += gradient_clipping_problems(zero_config, config.training.max_grad_norm)
    return problems + fused_step_process_problems(config.training, accelerator.num_processes)
