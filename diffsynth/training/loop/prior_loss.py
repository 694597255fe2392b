"""Regularization samples in a training step: their loss weight (``--prior_loss_weight``) and the ``loss_prior``
metric.

A mix with regularization images (``core.data.mix``) marks which draws are regularization rows. Each micro-batch's
per-sample losses are multiplied by a weight vector (1 for a training sample, ``--prior_loss_weight`` for a
regularization one) before the batch mean, as kohya's sd-scripts weights them; a weight of 0 leaves them out of the
gradient while they still count in the mean's denominator. ``loss_prior`` is the mean unweighted loss of the step's
regularization samples over every process, an empty cell on a step that drew none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...core.data.mix import DatasetMix


class PriorLoss:
    """The weights of each micro-batch and the ``loss_prior`` of each optimizer step.

    Args:
        dataset: The run's dataset; anything but a mix with regularization rows turns this off (no weights, no
            metric), and such a run trains exactly as before.
        weight: ``--prior_loss_weight``.
    """

    def __init__(self, dataset: Any, weight: float) -> None:
        self.mix = dataset if isinstance(dataset, DatasetMix) and dataset.has_reg else None
        self.weight = weight
        self._total, self._count = 0.0, 0

    @property
    def active(self) -> bool:
        """Whether the run draws regularization rows."""
        return self.mix is not None

    def weights(self, indices: Sequence[int]) -> torch.Tensor | None:
        """The weight of each sample of a micro-batch (by dataset index); None without regularization rows."""
        if self.mix is None:
            return None
        return torch.tensor([self.weight if self.mix.is_reg(index) else 1.0 for index in indices])

    def record(self, indices: Sequence[int], losses: torch.Tensor | None) -> None:
        """Adds the micro-batch's regularization samples' losses (``losses``: per sample, unweighted)."""
        if self.mix is None or losses is None:
            return
        for index, loss in zip(indices, losses.float().cpu().tolist()):
            if self.mix.is_reg(index):
                self._total += loss
                self._count += 1

    def step_value(self, accelerator: Any) -> float | None:
        """The step's mean regularization loss over every process (a collective), or None when no process drew
        one; the sums start again for the next step."""
        local = torch.tensor([self._total, float(self._count)], dtype=torch.float64)
        self._total, self._count = 0.0, 0
        total, count = accelerator.reduce(local.to(accelerator.device), reduction="sum").tolist()
        return total / count if count else None
