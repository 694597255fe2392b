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

import importlib
from collections.abc import Sequence
from typing import Any

import torch

from ..placement.deepspeed import deepspeed_config

DEFAULT_OPTIMIZER = "torch.optim.AdamW"


def resolve_optimizer_class(path: str) -> type[torch.optim.Optimizer]:
    """Imports the optimizer class ``path`` names (``package.module.Class``).

    Raises:
        ValueError: ``path`` is not dotted, its module does not import, it has no such attribute, or the attribute is
            not a ``torch.optim.Optimizer`` subclass; the message names the flag, the value and the fix.
    """
    flag = f"--customized_optimizer {path}"
    module_name, dot, class_name = path.rpartition(".")
    if not dot or not module_name or not class_name:
        raise ValueError(f"{flag} is not a dotted class path; pass e.g. --customized_optimizer torch.optim.Adam")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"{flag}: module {module_name} does not import ({error}); install its package (e.g. pip "
                         f"install {module_name.split('.')[0]}) or fix the path") from None
    found = getattr(module, class_name, None)
    if found is None:
        raise ValueError(f"{flag}: module {module_name} has no {class_name}; check the spelling (e.g. "
                         f"torch.optim.AdamW)")
    if not (isinstance(found, type) and issubclass(found, torch.optim.Optimizer)):
        raise ValueError(f"{flag} names {found!r}, which is not a torch.optim.Optimizer subclass; name an optimizer "
                         "class such as torch.optim.Adam")
    return found


def is_paged_optimizer(path: str) -> bool:
    """Whether ``--customized_optimizer`` names a paged bitsandbytes optimizer (``bitsandbytes.optim.Paged*``)."""
    return path.startswith("bitsandbytes.") and path.rpartition(".")[2].startswith("Paged")


def unpaged_optimizer(path: str) -> str:
    """The unpaged twin of a paged bitsandbytes optimizer path (``PagedAdamW8bit`` -> ``AdamW8bit``)."""
    module_name, _, class_name = path.rpartition(".")
    return f"{module_name}.{class_name.removeprefix('Paged')}"


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
