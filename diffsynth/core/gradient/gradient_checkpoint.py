"""One wrapper for every way of trading compute for activation memory around a block."""

from __future__ import annotations

import functools
import sys
from typing import Any

import torch
import torch.utils.checkpoint

from ..device import copy_to_host


def _deepspeed_checkpointing_configured() -> bool:
    # DeepSpeed is optional: if it was never imported, it cannot have been configured.
    deepspeed = sys.modules.get("deepspeed")
    return deepspeed is not None and deepspeed.checkpointing.is_configured()


def _any_requires_grad(values: Any) -> bool:
    return any(isinstance(v, torch.Tensor) and v.requires_grad for v in values)


class _ToHost(torch.autograd.Function):
    """A non-blocking copy to (pinned) host memory whose gradient flows back to the source device."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        ctx.device = tensor.device
        return copy_to_host(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.to(ctx.device)


def _checkpoint_with_inputs_on_host(module: Any, *args: Any, **kwargs: Any) -> Any:
    # Non-reentrant checkpointing keeps exactly the tensors passed to it; passing host copies (moved back inside the
    # checkpointed function, differentiably) leaves nothing of the block on the device between forward and backward.
    # The copies out are non-blocking into pinned memory, so the forward never waits for them; the copies back are
    # ordered on the same stream, so they read complete data.
    names = list(kwargs)
    values = [*args, *kwargs.values()]
    devices = [v.device if isinstance(v, torch.Tensor) else None for v in values]
    host_values = [_ToHost.apply(v) if isinstance(v, torch.Tensor) else v for v in values]

    def run_on_device(*host_inputs: Any) -> Any:
        inputs = [v.to(d) if d is not None else v for v, d in zip(host_inputs, devices)]
        return module(*inputs[: len(args)], **dict(zip(names, inputs[len(args):])))

    return torch.utils.checkpoint.checkpoint(run_on_device, *host_values, use_reentrant=False)


def gradient_checkpoint_forward(module: torch.nn.Module | Any, use_gradient_checkpointing: bool,
                                use_gradient_checkpointing_offload: bool = False, *args: Any, **kwargs: Any) -> Any:
    """Calls ``module(*args, **kwargs)``, checkpointing its activations when asked.

    - ``use_gradient_checkpointing``: keep only the block's inputs and recompute the rest in backward (torch
      non-reentrant checkpointing): activation memory of one block instead of all, for about one extra forward.
    - ``use_gradient_checkpointing_offload``: additionally keep those saved inputs in host memory: near-zero
      activation memory on the device, for a device-to-host and a host-to-device copy of the block's inputs. The
      copy out is non-blocking into pinned memory. Unlike ``torch.autograd.graph.save_on_cpu``, which moves every
      activation a block saves (tens of times its input) and recomputes nothing, this moves only the block's input
      and recomputes the block in backward: less PCIe traffic and host memory for one extra forward per block. Prefer
      ``save_on_cpu`` only when compute, not transfer bandwidth or host memory, is the bottleneck.
    - When DeepSpeed activation checkpointing has been configured (``initialize_deepspeed_gradient_checkpointing``),
      DeepSpeed's own checkpoint is used, so that it can partition or offload activations as configured.

    Nothing is checkpointed when gradients are disabled or no input needs them (there is nothing to save).
    """
    if not (use_gradient_checkpointing or use_gradient_checkpointing_offload) or not torch.is_grad_enabled():
        return module(*args, **kwargs)
    if _deepspeed_checkpointing_configured():
        import deepspeed

        if not _any_requires_grad([*args, *kwargs.values()]):
            # DeepSpeed's reentrant checkpoint would produce outputs that need no gradient at all.
            return module(*args, **kwargs)
        return deepspeed.checkpointing.checkpoint(functools.partial(module, **kwargs), *args)
    if use_gradient_checkpointing_offload:
        return _checkpoint_with_inputs_on_host(module, *args, **kwargs)
    return torch.utils.checkpoint.checkpoint(module, *args, use_reentrant=False, **kwargs)
