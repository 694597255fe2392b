"""Averages trainable gradients across processes for models that DDP does not wrap (offload training).

DDP cannot wrap an offloaded model: its parameters change storage as units load and unload, and optimizer-offloaded
gradients live in host memory. Without DDP nothing is all-reduced and every rank trains its own model. This module
does the one thing DDP would have done: after the backward pass, the gradients of the trainable parameters are
summed across processes in a few large buckets, where they live (device gradients on the device, host gradients
through a gloo group, since NCCL cannot reduce host memory), and divided by the process count.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

DEFAULT_BUCKET_MB = 25.0


def distributed_world_size() -> int:
    """The number of processes in the default group, 1 when torch.distributed is not initialised."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


@dataclasses.dataclass
class GradientSyncConfig:
    """How gradients are averaged.

    Args:
        bucket_mb: Gradients are flattened into buckets of about this size; fewer, larger all-reduces use the
            network better, at the cost of one bucket of extra memory.
    """

    bucket_mb: float = DEFAULT_BUCKET_MB

    def __post_init__(self) -> None:
        if not self.bucket_mb > 0:
            raise ValueError(f"bucket_mb={self.bucket_mb!r} must be a positive size in MB, e.g. 25")


class GradientSynchronizer:
    """Averages the ``.grad`` of ``params`` across all processes of the default group.

    Every rank must hold the same parameters in the same order and call ``all_reduce_mean`` at the same points; a
    parameter without a gradient on one rank takes part as zeros, so the buckets always line up.

    Args:
        params: The trainable parameters, in a fixed order.
        config: Bucket size.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], config: GradientSyncConfig | None = None) -> None:
        self.params = [param for param in params if param.requires_grad]
        self.config = config or GradientSyncConfig()
        self.world_size = distributed_world_size()
        self._host_group = None

    def _group_for(self, device: torch.device):
        """The default group, or a gloo group for host tensors when the default backend cannot reduce them."""
        if device.type != "cpu" or dist.get_backend() == "gloo":
            return None
        if self._host_group is None:
            logger.info("host gradients are all-reduced through a gloo group (the default backend is %s)",
                        dist.get_backend())
            self._host_group = dist.new_group(backend="gloo")
        return self._host_group

    def all_reduce_mean(self) -> None:
        """Replaces each gradient by its mean over the processes. A no-op in a single process."""
        if self.world_size == 1:
            return
        for param in self.params:
            if param.grad is None:
                param.grad = torch.zeros_like(param, device=param.data.device)
        limit = int(self.config.bucket_mb * 1024 * 1024)
        buckets: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        sizes: dict[tuple[torch.device, torch.dtype], int] = {}
        for param in self.params:
            key = (param.grad.device, param.grad.dtype)
            buckets.setdefault(key, []).append(param.grad)
            sizes[key] = sizes.get(key, 0) + param.grad.numel() * param.grad.element_size()
            if sizes[key] >= limit:
                self._reduce(buckets.pop(key))
                sizes.pop(key)
        for bucket in buckets.values():
            self._reduce(bucket)

    def _reduce(self, grads: list[torch.Tensor]) -> None:
        flat = torch.cat([grad.reshape(-1) for grad in grads])
        dist.all_reduce(flat, group=self._group_for(flat.device))
        flat.div_(self.world_size)
        offset = 0
        for grad in grads:
            grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
            offset += grad.numel()
