"""An exponential moving average of the trained weights (``--ema_decay D``), kept in fp32 in host memory.

After every applied optimizer step, ``ema = D * ema + (1 - D) * weight`` for each trained weight (a LoRA's weights
in a LoRA run, the model's in a full fine-tune). EMA weights often sample better than the last step's, at the cost
of one fp32 copy of the trained weights in host memory (none on the device) and, when the weights live on the device,
one device-to-host copy of them per step. It starts from the weights the run starts from.

- **Skipped steps** (non-finite, ``nonfinite_guard``) change no weight and do not update the EMA either.
- **Several processes** hold the same weights after every step, so only the main process keeps an EMA and writes
  it; the others hold nothing (host memory matters most when every rank of a machine shares it).
- **Files.** Each weights file the run writes (``step-N``, ``epoch-N``) gets an EMA twin ``<name>-ema`` in the same
  format; training-state checkpoints hold the EMA (``ema.safetensors``), so a resumed run continues it exactly.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

EMA_SUFFIX = "-ema"


class WeightEMA:
    """The EMA of ``weights`` (named as the training module's ``trainable_state_dict()``).

    Args:
        weights: The trained parameters by name; their current values start the average.
        decay: ``D`` in (0, 1): the weight of the average so far at each update.

    Raises:
        ValueError: ``decay`` is outside (0, 1).
    """

    def __init__(self, weights: Mapping[str, torch.nn.Parameter], decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"--ema_decay {decay} must lie strictly between 0 and 1; pass e.g. --ema_decay 0.999")
        self.decay = decay
        self.weights = dict(weights)
        self.average = {name: self._host_copy(weight) for name, weight in self.weights.items()}

    @staticmethod
    def _host_copy(weight: torch.Tensor) -> torch.Tensor:
        return weight.detach().to("cpu", torch.float32, copy=True)

    @torch.no_grad()
    def update(self) -> None:
        """Moves the average towards the current weights: ``ema += (1 - D) * (weight - ema)``."""
        for name, weight in self.weights.items():
            value = weight.detach()
            if value.device.type != "cpu" or value.dtype != torch.float32:
                value = value.to("cpu", torch.float32)
            self.average[name].lerp_(value, 1.0 - self.decay)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The average by weight name (the tensors themselves: copy them to keep a snapshot)."""
        return dict(self.average)

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Restores an average from ``state_dict()`` (resuming).

        Raises:
            ValueError: The names or shapes differ from the trained weights'.
        """
        if set(state) != set(self.average):
            missing = sorted(set(self.average) - set(state))
            unexpected = sorted(set(state) - set(self.average))
            raise ValueError(f"the checkpoint's EMA weights differ from this run's trained weights (missing "
                             f"{missing[:3]}, unexpected {unexpected[:3]}); resume with the flags it was trained with")
        for name, value in state.items():
            if value.shape != self.average[name].shape:
                raise ValueError(f"the checkpoint's EMA of {name} has shape {tuple(value.shape)}, the weight "
                                 f"{tuple(self.average[name].shape)}; resume with the flags it was trained with")
            self.average[name].copy_(value)
