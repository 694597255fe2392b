"""What training keeps per trained weight besides the weight: its gradient, the optimizer's state, the EMA.

For a LoRA these are small; for a full fine-tune each is as large as the model or larger, so where they live decides
what fits. The planner (``plans.predict``) places them per plan:

- **Gradients** are as large as the trained weights, in their dtype, and all exist from backward to the optimizer
  step on the device that trains the weights. With optimizer offload each one is copied to the host as it is made
  and the host keeps a copy until the step; with the fused step (``--fused_optimizer_step``) each weight is updated
  as soon as its gradient is complete and the gradient is freed, so at most the largest one exists (on the device,
  and on the host with optimizer offload).
- **Optimizer state** lives beside the trained weights (on the device, or on the host with optimizer offload); its
  size depends on the optimizer class (``OPTIMIZERS``): torch's Adam and AdamW keep two moments in the weight's own
  dtype, bitsandbytes' 32-bit ones two float32 moments, its 8-bit ones two uint8 moments with one float32 scale per
  256 values, except for tensors under 4,096 values, which keep float32 moments. A paged optimizer's state sits in
  CUDA unified memory that the driver pages out to the host under pressure: planned on the device, where it lives
  until memory runs short.
- **The EMA** (``--ema_decay``) is a float32 copy of the trained weights in host memory, in the main process only
  (once per machine); when the weights train on the device, each step copies them to the host for it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

DEFAULT_OPTIMIZER = "torch.optim.AdamW"
EIGHT_BIT_MIN_NUMEL = 4096
"""bitsandbytes' ``min_8bit_size``: smaller tensors keep 32-bit state in its 8-bit optimizers."""
EIGHT_BIT_BLOCK = 256
"""Values per float32 scale (``absmax``) of bitsandbytes' blockwise 8-bit state."""
EMA_BYTES_PER_VALUE = 4
"""The EMA is float32."""


@dataclasses.dataclass(frozen=True)
class OptimizerState:
    """The state an optimizer class keeps per trained weight.

    Attributes:
        name: The class's dotted path (``--customized_optimizer``).
        moments: State tensors per weight (Adam: 2, Lion: 1, SGD without momentum: 0).
        bits: 8 or 32 for bitsandbytes' fixed-width state; None for state in the weight's dtype (torch's optimizers).
        paged: Whether the state is in CUDA unified memory (bitsandbytes' ``Paged*``).
        known: False for a class the planner does not know, planned as AdamW.
    """

    name: str
    moments: int
    bits: int | None = None
    paged: bool = False
    known: bool = True

    def bytes_for(self, weights: Iterable[tuple[int, int]]) -> int:
        """Bytes of state for weights given as ``(numel, element_size)`` pairs."""
        total = 0
        for numel, element_size in weights:
            if self.bits is None:
                total += self.moments * numel * element_size
            elif self.bits == 8 and numel >= EIGHT_BIT_MIN_NUMEL:
                blocks = -(-numel // EIGHT_BIT_BLOCK)
                total += self.moments * (numel + 4 * blocks)
            else:
                total += self.moments * numel * 4
        return total


def _bitsandbytes(name: str, moments: int, bits: int) -> tuple[str, OptimizerState]:
    path = f"bitsandbytes.optim.{name}"
    return path, OptimizerState(path, moments, bits, paged=name.startswith("Paged"))


OPTIMIZERS = dict([
    ("torch.optim.AdamW", OptimizerState("torch.optim.AdamW", 2)),
    ("torch.optim.Adam", OptimizerState("torch.optim.Adam", 2)),
    *(_bitsandbytes(f"{paged}{base}{width}", moments, bits)
      for paged in ("", "Paged") for base, moments in (("AdamW", 2), ("Adam", 2), ("Lion", 1))
      for width, bits in (("8bit", 8), ("32bit", 32), ("", 32))),
])
"""The optimizer classes whose state the planner knows. bitsandbytes' classes without a width (``AdamW``) keep
32-bit state by default."""


def optimizer_state(name: str | None) -> OptimizerState:
    """The state of the optimizer ``--customized_optimizer`` names (None: AdamW); an unknown class is planned as AdamW,
    with ``known`` False."""
    name = name or DEFAULT_OPTIMIZER
    if name in OPTIMIZERS:
        return OPTIMIZERS[name]
    return dataclasses.replace(OPTIMIZERS[DEFAULT_OPTIMIZER], name=name, known=False)


@dataclasses.dataclass(frozen=True)
class TrainingSetup:
    """The flags that size what training keeps beside the weights.

    Attributes:
        optimizer: ``--customized_optimizer`` (None: AdamW).
        ema: Whether ``--ema_decay`` is given.
        fused_step: ``--fused_optimizer_step``.
    """

    optimizer: str | None = None
    ema: bool = False
    fused_step: bool = False
