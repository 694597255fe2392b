"""The validation loss: the mean loss over a held-out set at fixed timesteps and noise, every
``--validation_loss_steps`` optimizer steps and at the end of training.

Fixed draws. Sample ``i`` of the validation set draws its timestep and noise from :func:`validation_generator`
``(i)``, a generator that depends on the index alone (not on ``--seed``, the step or the process), so the same weights
give the same value in any run, and the values of one run form a curve without draw noise. The loss is the training
loss (the same rule, weighting and boundaries), one sample at a time, in eval mode and without gradients.

Processes. Each process takes every ``num_processes``-th sample; the per-sample losses are summed into one vector by
an all-reduce (each entry set by one process, the others adding zeros, which is exact) and averaged in index order,
so the value does not depend on the process count.

Training's randomness. The pass runs inside ``torch.random.fork_rng`` and draws only from its own generators, and
the placers' pass is ended afterwards (nothing stays loaded): training continues bit-identically, so a run with a
validation loss trains the weights of a run without. Models under ``--enable_model_cpu_offload`` or block swap are
streamed by training's own placers, as in a training step. Memory: one sample's forward without activations kept,
less than a training step; time: one forward per validation sample.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ...core.data.bad_samples import pop_skipped

logger = logging.getLogger(__name__)

#: The seed of the validation draws ("val" in ASCII): another stream than any training ``--seed`` uses.
VALIDATION_SEED = 0x76616C


def validation_generator(index: int) -> torch.Generator:
    """The CPU generator of validation sample ``index``'s timestep and noise: a function of the index alone."""
    (state,) = np.random.SeedSequence([VALIDATION_SEED, index]).generate_state(1, dtype=np.uint64)
    return torch.Generator().manual_seed(int(state))


@contextlib.contextmanager
def evaluating(module: torch.nn.Module) -> Iterator[None]:
    """``module`` in eval mode without gradients while the block runs; every submodule's mode is restored after."""
    modes = [(child, child.training) for child in module.modules()]
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for child, training in modes:
            child.training = training


def sample_losses(forward: Any, module: torch.nn.Module, dataset: Dataset, process_index: int = 0,
                  num_processes: int = 1, autocast: Any = contextlib.nullcontext) -> torch.Tensor:
    """The loss of every ``num_processes``-th validation sample from ``process_index`` on, at its fixed draws.

    Args:
        forward: Computes the loss of a list of samples with ``generators`` (the training module, or its wrapper).
        module: The training module (put in eval mode meanwhile).
        dataset: The validation set (raw samples or a stage-1 cache).
        process_index: This process.
        num_processes: Processes sharing the set.
        autocast: The run's autocast context (``accelerator.autocast``).

    Returns:
        A float64 vector of one entry per sample, zero at the samples other processes take.
    """
    losses = torch.zeros(len(dataset), dtype=torch.float64)
    with evaluating(module):
        for index in range(process_index, len(dataset), num_processes):
            sample = dataset[index]
            pop_skipped(sample)  # a replacement for an undecodable file: measured as the training set would be
            with autocast():
                loss = forward([sample], generators=[validation_generator(index)])
            losses[index] = loss.detach().double().cpu()
    return losses


def mean_loss(losses: torch.Tensor) -> float:
    """The mean of the per-sample losses, summed exactly in index order."""
    return math.fsum(losses.tolist()) / len(losses)


class ValidationLoss:
    """Measures the validation loss at the steps asked for.

    Args:
        dataset: The validation set.
        steps: ``--validation_loss_steps``; None measures at the end only.
        placers: Training's placers, whose pass is ended after measuring.
    """

    def __init__(self, dataset: Dataset, steps: int | None, placers: Sequence[Any] = ()) -> None:
        self.dataset, self.steps, self.placers = dataset, steps, list(placers)

    def due(self, step: int, total_steps: int) -> bool:
        """Whether to measure after optimizer ``step``: every ``steps`` steps and at the last one."""
        return step >= total_steps or (self.steps is not None and step % self.steps == 0)

    def measure(self, accelerator: Any, forward: Any, module: torch.nn.Module) -> float:
        """The mean validation loss, the same on every process; a collective (every process calls it)."""
        devices = [accelerator.device] if accelerator.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            losses = sample_losses(forward, module, self.dataset, accelerator.process_index,
                                   accelerator.num_processes, accelerator.autocast)
        for placer in self.placers:
            placer.after_backward(sync_gradients=False)  # ends the pass: nothing stays loaded
        if accelerator.num_processes > 1:
            losses = accelerator.reduce(losses.to(accelerator.device), reduction="sum").cpu()
        return mean_loss(losses)
