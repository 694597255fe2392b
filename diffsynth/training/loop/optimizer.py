"""The optimizer of a training run: AdamW, DeepSpeed's CPU Adam under ZeRO optimizer offload, or the class that
``--customized_optimizer`` names (the reference's flag: a dotted path such as ``torch.optim.Adam`` or
``bitsandbytes.optim.AdamW8bit``).

The named class is imported while the flags are checked, before any model loads, so a typo or a missing package
costs seconds. It is built as ``cls(params, lr=--learning_rate, weight_decay=--weight_decay)``, as in the reference;
its state goes into training-state checkpoints through ``state_dict()`` like AdamW's.

bitsandbytes' 8-bit optimizers (``bitsandbytes.optim.AdamW8bit``) keep both moments in 8 bits with per-block scales:
about a quarter of AdamW's fp32 state, with the same update up to quantisation. They run on the host too, so they
combine with ``--enable_optimizer_cpu_offload``. The paged ones (``PagedAdamW8bit``, ``PagedAdamW``) put their state in
CUDA unified memory that the driver pages out to the host under memory pressure: they need CUDA and weights trained
on the GPU, and are refused elsewhere (bitsandbytes itself would fall back to unpaged state with a warning).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..config.optimizer_names import is_paged_optimizer, resolve_optimizer_class, unpaged_optimizer
from ..placement.deepspeed import deepspeed_config

DEFAULT_OPTIMIZER = "torch.optim.AdamW"


def make_optimizer(params: Sequence[torch.nn.Parameter], learning_rate: float, weight_decay: float,
                   accelerator: Any, customized: str | None = None) -> torch.optim.Optimizer:
    """The run's optimizer over ``params``.

    ``customized`` (``--customized_optimizer``) wins; otherwise AdamW, or DeepSpeed's CPU Adam when ZeRO keeps the
    optimizer states in CPU memory (vectorised, much faster there).
    """
    if customized:
        on_host = [param for param in params if param.device.type == "cpu"]
        if is_paged_optimizer(customized) and on_host:
            raise ValueError(f"--customized_optimizer {customized} pages optimizer state in CUDA memory, but "
                             f"{len(on_host)} trained weight(s) are in host memory (a CPU run, or "
                             f"--enable_optimizer_cpu_offload); use --customized_optimizer {unpaged_optimizer(customized)}")
        return resolve_optimizer_class(customized)(params, lr=learning_rate, weight_decay=weight_decay)
    config = deepspeed_config(accelerator) or {}
    offload = config.get("zero_optimization", {}).get("offload_optimizer", {}).get("device", "none")
    if offload in ("cpu", "nvme"):
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(params, lr=learning_rate, weight_decay=weight_decay, adamw_mode=True)
    return torch.optim.AdamW(params, lr=learning_rate, weight_decay=weight_decay)
