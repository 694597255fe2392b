"""The non-finite guard: an optimizer step whose loss or gradient norm is NaN or inf changes no weight.

One NaN gradient applied by AdamW makes every weight it touches NaN for good, and every later LoRA file and
checkpoint with them. So each optimizer step is checked before it is applied:

- **What is checked.** The loss of every micro-batch of the step (gradient accumulation) and the norm of the
  gradients once they are complete and averaged (after the offload managers' ``after_backward`` and block swap's
  gradient sync, before clipping). With ``--max_grad_norm`` the norm clipping computes anyway is reused; without it
  one more pass over the gradients (cheap next to the optimizer's own passes) computes it.
- **All processes agree.** Each process's verdict travels in the step's one all-reduce (the runner's), so all of
  them skip, or all of them step, and their weights stay identical.
- **A skipped step** applies no update and zeroes the gradients; the optimizer's own step count does not advance.
  The step still counts as a step: its batches were consumed, so the step counter, the learning-rate schedule, the
  save points and the metrics advance as they would have, and a run's schedule never outlasts its data.
- **Stopping.** ``--max_nonfinite_steps`` bad steps in a row mean the run diverged (an isolated bad sample gives one
  bad step; a too-high learning rate gives nothing but bad steps from some point on): training stops with
  :class:`TrainingDivergedError`, naming the step, the samples of the bad steps and the last checkpoint.
- **fp16 mixed precision.** accelerate's gradient scaler already skips steps whose scaled gradients overflow, and
  lowers its scale: that is calibration, not divergence, so gradients are not checked then (the loss still is).
- **DeepSpeed** applies the update inside ``backward``, where it cannot be skipped, so the loss is checked before
  each backward and the first non-finite loss stops training, with the weights still finite.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

_SAMPLES_SHOWN = 8  # per step: gradient accumulation times processes can be many
_STEPS_SHOWN = 10


class TrainingDivergedError(RuntimeError):
    """Training stopped on non-finite losses or gradients; ``step`` is the optimizer step it stopped at."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


def gradient_norm(params: Iterable[torch.nn.Parameter]) -> torch.Tensor | None:
    """The L2 norm of the parameters' gradients (None when none has one), as ``clip_grad_norm_`` computes it."""
    grads = [param.grad for param in params if param.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else None


def step_is_finite(micro_losses: Sequence[torch.Tensor], grad_norm: torch.Tensor | None) -> bool:
    """Whether every micro-batch loss of a step, and its gradient norm when checked, are finite (one device sync)."""
    values = [loss.reshape(1) for loss in micro_losses]
    if grad_norm is not None:
        values.append(grad_norm.reshape(1).to(values[0].device if values else grad_norm.device))
    return bool(torch.isfinite(torch.cat(values)).all()) if values else True


def _listing(samples: Sequence[str]) -> str:
    unique = list(dict.fromkeys(samples)) or ["(not known)"]
    shown = "; ".join(unique[:_SAMPLES_SHOWN])
    return shown + (f"; and {len(unique) - _SAMPLES_SHOWN} more" if len(unique) > _SAMPLES_SHOWN else "")


class NonFiniteGuard:
    """Counts skipped steps and decides when a run has diverged.

    Args:
        max_consecutive: Bad steps in a row that stop training (``--max_nonfinite_steps``).
        skipped: Bad steps counted before (a resumed run continues its count).
    """

    def __init__(self, max_consecutive: int, skipped: int = 0) -> None:
        if max_consecutive < 1:
            raise ValueError(f"--max_nonfinite_steps {max_consecutive} must be at least 1; pass e.g. "
                             "--max_nonfinite_steps 3")
        self.max_consecutive = max_consecutive
        self.skipped = skipped
        self.consecutive = 0
        self._streak: list[tuple[int, Sequence[str]]] = []  # (step, its samples) of the bad steps in a row

    def record(self, step: int, finite: bool, samples: Sequence[str] = ()) -> bool:
        """Counts optimizer step ``step``; ``samples`` names what it trained on (all processes).

        Returns:
            Whether training must stop: the last ``max_consecutive`` steps were all bad.
        """
        if finite:
            self.consecutive = 0
            self._streak.clear()
            return False
        self.skipped += 1
        self.consecutive += 1
        self._streak = [*self._streak[1 - _STEPS_SHOWN:], (step, samples)]
        logger.warning("optimizer step %d skipped (no update): non-finite loss or gradient norm, %d step(s) in a row "
                       "(--max_nonfinite_steps %d); samples: %s", step, self.consecutive, self.max_consecutive,
                       _listing(samples))
        return self.consecutive >= self.max_consecutive

    def diverged(self, step: int, last_checkpoint: Path | None, last_weights: Path | None,
                 deepspeed: bool = False) -> TrainingDivergedError:
        """The error that stops training at ``step``, naming the streak's samples and where to go back to."""
        if deepspeed:
            what = (f"the loss of optimizer step {step} is NaN or inf; DeepSpeed applies each update inside backward, "
                    "where it cannot be skipped, so training stops at the first one (before its backward: the weights "
                    "are still finite)")
        else:
            first = step - self.consecutive + 1
            what = (f"the loss or gradient norm was NaN or inf on {self.consecutive} optimizer step(s) in a row "
                    f"(steps {first} to {step}; --max_nonfinite_steps {self.max_consecutive}); those steps were "
                    "skipped, so no weight took them")
        listing = " | ".join(f"step {bad}: {_listing(samples)}" for bad, samples in self._streak)
        where = (f"the last checkpoint is {last_checkpoint} (--resume_from_checkpoint {last_checkpoint}; skipped "
                 "steps changed no weight, so it holds the weights from before the first of them)"
                 if last_checkpoint is not None else "no training-state checkpoint was written yet")
        if last_weights is not None:
            where += f"; the newest weights file is {last_weights}"
        return TrainingDivergedError(
            f"training stopped at optimizer step {step}: {what}. Samples: {listing}. Every file written holds "
            f"finite weights; {where}. Lower --learning_rate (or set --max_grad_norm 1.0), or check the samples "
            "named, then resume or restart", step)
