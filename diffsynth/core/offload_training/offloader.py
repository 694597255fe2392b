"""Per-tensor offloaders: where a parameter or buffer lives between uses, and how it gets to the compute device.

Four kinds, chosen by the manager:

| tensor                                    | offloader                     | between uses            | on load         |
|-------------------------------------------|-------------------------------|-------------------------|-----------------|
| frozen parameter                          | ``StaticParamOffloader``      | empty device placeholder| copy of master  |
| trainable parameter, optimizer offloaded  | ``TrainableParamOffloader``   | host tensor (the master)| copy of master  |
| trainable parameter, optimizer on device  | ``AlwaysOnDeviceParamOffloader``| on the device         | nothing         |
| buffer                                    | ``BufferOffloader``           | host master             | copy of master  |

Frozen weights are never copied back (they do not change). Trainable weights change only on the host, where the
optimizer steps; their gradients are moved to the host as soon as autograd has accumulated them. Persistent buffers of
a module in training mode (BatchNorm running statistics) are written back to their master when unloaded.

A tensor shared by several units (tied weights) has one offloader; it loads on its first user and unloads when the
last user is done (reference counting).

A load can be deferred (prefetch, ``prefetch.py``): the device copy is allocated at once, and the copy itself is handed
to a transfer engine, which fills it on a copy stream. Until ``wait_for_copy()`` has ordered the compute stream behind
that copy, the device copy must be neither read nor freed: the tensor stays bound to its resting place (a frozen
weight to its empty placeholder, so a stray read fails loudly instead of reading half-copied bytes) and is bound to
the device copy only by ``wait_for_copy()``; ``offload()`` waits before it frees.

With a ``DeviceBufferPool`` (``device_pool.py``) device copies are buffers lent by the pool and given back on unload,
instead of fresh allocations each time. A load and an unload run a few hundred times per step: what they need that
does not change (whether the pool lends this tensor's copies, on which kind of device) is decided once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from ..device import copy_into, copy_to_device, record_event, synchronize_event
from ..shared_weights import is_shared_host
from .device_pool import DeviceBufferPool, PooledBuffer
from .hooks import ResidencyMeter
from .memory_buffer import BaseBufferPool, tensor_nbytes
from .transfer import CopyPair


class TensorOffloader:
    """Base class: reference-counted loading of one tensor onto the compute device.

    Subclasses implement ``_load``, ``_bind``, ``_unload`` and ``restore``; ``device_copy`` is the tensor the model computes
    with while loaded (the manager uses it to recognise saved weights in autograd's graph).

    Args:
        tensor: The parameter or buffer.
        device: The compute device.
        meter: Counts resident bytes and indexes live device copies.
        device_pool: Lends the device copies; None allocates each one afresh.
    """

    counts_toward_residency = False

    def __init__(self, tensor: torch.Tensor, device: torch.device, meter: ResidencyMeter,
                 device_pool: DeviceBufferPool | None = None) -> None:
        self.device = device
        self.device_pool = device_pool
        self.nbytes = tensor_nbytes(tensor)
        self.original_device = tensor.device
        self.users = 0
        self.device_copy: torch.Tensor | None = None
        self.load_count = 0
        self.copy_pending: Callable[[], None] | None = None
        self._meter = meter
        self._released_copies: list[StorageWeakRef] = []
        self._bind_after_copy = False
        self._lease: PooledBuffer | None = None
        self._pooled: bool | None = None  # whether the pool lends this tensor's copies; decided on the first load
        self._copy_address = 0
        self._host_copies = device.type == "cpu"

    @property
    def is_loaded(self) -> bool:
        return self.users > 0

    def onload(self, deferred: list[CopyPair] | None = None) -> bool:
        """Makes the tensor usable on the compute device (a no-op for the second and later users).

        Args:
            deferred: Where to queue the copy instead of making it: the device copy is allocated and bound now, and
                ``(device copy, master)`` is appended for a transfer engine (a prefetch). None copies now.

        Returns:
            Whether a copy was queued in ``deferred`` (the caller must then set ``copy_pending``).
        """
        self.users += 1
        queued = False
        if self.users == 1:
            before = len(deferred) if deferred is not None else 0
            self._load(deferred)
            queued = deferred is not None and len(deferred) > before
            if queued:
                self._bind_after_copy = True
            else:
                self._bind()
            self.load_count += 1
            if self.device_copy is not None:
                lease = self._lease
                self._copy_address = (lease.address if lease is not None
                                      else self.device_copy.untyped_storage().data_ptr())
                self._meter.copies[self._copy_address] = self
            if self.counts_toward_residency:
                self._meter.add(self.nbytes)
        return queued

    def wait_for_copy(self) -> None:
        """Orders the compute queued from now on behind this tensor's deferred copy; a no-op when none is pending.

        Costs nothing on the host: on CUDA the compute stream waits for an event, on the CPU the copy is done.
        """
        waiter, self.copy_pending = self.copy_pending, None
        if waiter is not None:
            waiter()
        if self._bind_after_copy:
            self._bind_after_copy = False
            self._bind()

    def offload(self) -> None:
        """Releases one use; the last one moves the tensor back to its resting place."""
        if self.users == 0:
            return
        self.users -= 1
        if self.users == 0:
            # A deferred copy may still be writing the device copy: free (or copy back) only behind it.
            if self.copy_pending is not None or self._bind_after_copy:
                self.wait_for_copy()
            self._unload()
            if self.device_copy is not None:
                self._drop_device_copy()
            if self.counts_toward_residency:
                self._meter.sub(self.nbytes)

    def live_copy_bytes(self) -> int:
        """Bytes of device copies of this tensor still alive outside the device pool: the loaded one, and any that
        something (autograd, a user) kept after its unload."""
        self._released_copies = [ref for ref in self._released_copies if not ref.expired()]
        return self.nbytes * (len(self._released_copies) + (self.device_copy is not None))

    def _drop_device_copy(self) -> None:
        self._meter.copies.pop(self._copy_address, None)
        lease, self._lease = self._lease, None
        if lease is None or not self.device_pool.give_back(lease):
            self._released_copies = [ref for ref in self._released_copies if not ref.expired()]
            self._released_copies.append(StorageWeakRef(self.device_copy.untyped_storage()))
        self.device_copy = None

    def _copy_of(self, master: torch.Tensor, deferred: list[CopyPair] | None) -> torch.Tensor:
        """A device copy of ``master``: made now, or allocated and queued in ``deferred`` (contiguous masters)."""
        pooled = self._pooled
        if pooled is None:
            pooled = self._pooled = self.device_pool is not None and self.device_pool.accepts(master)
        if pooled:
            self._lease = self.device_pool.take(master)
            copy = self._lease.tensor
        elif deferred is None or not master.is_contiguous():
            return copy_to_device(master, self.device)
        else:
            # Allocated on the current (compute) stream, so the caching allocator reuses it there; the engine's copy
            # starts only after the compute queued so far, which covers the kernels that last used this memory.
            copy = torch.empty_like(master, device=self.device)
        if deferred is not None:
            deferred.append((copy, master))
        elif self._host_copies:
            copy.copy_(master)  # what ``copy_into`` does for a host destination, without its checks
        else:
            copy_into(copy, master)
        return copy

    def _load(self, deferred: list[CopyPair] | None) -> None:
        """Makes ``device_copy`` (filled now, or by the engine when ``deferred`` is given); nothing by default."""

    def _bind(self) -> None:
        """Points the module's tensor at ``device_copy``, once its contents can be read; nothing by default."""

    def _unload(self) -> None:
        """Points the module's tensor back at its resting place; nothing by default."""

    def restore(self) -> None:
        """Turns the tensor back into an ordinary tensor on its original device."""
        raise NotImplementedError


class StaticParamOffloader(TensorOffloader):
    """A frozen parameter: one host master, an empty placeholder on the device between uses, no copy back.

    A parameter loaded into the machine's shared host copy is its own master (``BaseBufferPool.host_master``).
    """

    counts_toward_residency = True

    def __init__(self, param: torch.nn.Parameter, device: torch.device, meter: ResidencyMeter,
                 pool: BaseBufferPool, device_pool: DeviceBufferPool | None = None) -> None:
        super().__init__(param, device, meter, device_pool)
        self.param = param
        self.master = pool.host_master(param.data)
        self.placeholder = torch.empty(0, dtype=param.dtype, device=device)
        param.data = self.placeholder

    def _load(self, deferred: list[CopyPair] | None) -> None:
        self.device_copy = self._copy_of(self.master, deferred)

    def _bind(self) -> None:
        self.param.data = self.device_copy

    def _unload(self) -> None:
        self.param.data = self.placeholder

    def restore(self) -> None:
        if self.original_device.type == "cpu" and is_shared_host(self.master):
            self.param.data = self.master  # back where it was loaded: a private copy would undo the sharing
        else:
            self.param.data = torch.empty_like(self.master, device=self.original_device).copy_(self.master)


class TrainableParamOffloader(TensorOffloader):
    """A trainable parameter whose optimizer runs on the host.

    The host tensor is the master that the optimizer updates; the device copy is read-only and simply dropped after
    use. With a host pool the master lives there (pinned where possible), so its copies to the device do not block.

    Gradients are accumulated on the host: as soon as autograd has accumulated a gradient, a copy of it to a host
    staging buffer is queued on the compute stream (without blocking, into pinned memory) and the device gradient is
    dropped; the staged gradient is added to the host gradient when it is next needed (``publish_grad``, which waits
    for the copies), so gradient accumulation over several backward passes works.

    Args:
        pool: Host memory for the master and the gradient staging buffer; None keeps the parameter's own tensor as
            the master (moved to the host if needed) and stages in ordinary memory.
    """

    counts_toward_residency = True

    def __init__(self, param: torch.nn.Parameter, device: torch.device, meter: ResidencyMeter,
                 pool: BaseBufferPool | None = None, device_pool: DeviceBufferPool | None = None) -> None:
        super().__init__(param, device, meter, device_pool)
        self.param = param
        self._pool = pool
        host = torch.device("cpu")
        if pool is not None:
            param.data = pool.allocate_like(param.data)
        elif param.device != host:
            param.data = param.data.to(host)
        if param.grad is not None and param.grad.device != host:
            param.grad = param.grad.to(host)
        self.master = param.data
        self.host_grad: torch.Tensor | None = None
        self._grad_staging: torch.Tensor | None = None
        self._grad_copied: Any = None
        self._grad_in_flight = False
        self._hook = param.register_post_accumulate_grad_hook(self._move_grad_to_host)

    def _load(self, deferred: list[CopyPair] | None) -> None:
        self._finish_grad_copy()
        if self.param.grad is not None:
            published, self.param.grad = self.param.grad, None
            self.host_grad = published if self.host_grad is None else published.add_(self.host_grad)
        self.device_copy = self._copy_of(self.master, deferred)

    def _bind(self) -> None:
        self.param.data = self.device_copy

    def _unload(self) -> None:
        self.param.data = self.master

    def _move_grad_to_host(self, param: torch.nn.Parameter) -> None:
        # A second backward before ``publish_grad`` reuses the staging buffer: the first copy must have landed.
        self._finish_grad_copy()
        grad = param.grad
        if self._grad_staging is None or self._grad_staging.shape != grad.shape:
            self._grad_staging = (self._pool.empty_like(grad) if self._pool is not None
                                  else torch.empty_like(grad, device="cpu"))
        copy_into(self._grad_staging, grad)
        self._grad_copied = record_event(grad.device)
        self._grad_in_flight = True
        param.grad = None

    def _finish_grad_copy(self) -> None:
        if self._grad_in_flight:
            synchronize_event(self._grad_copied)
            staged = self._grad_staging
            self.host_grad = staged.clone() if self.host_grad is None else self.host_grad.add_(staged)
            self._grad_copied, self._grad_in_flight = None, False

    def step_on_host(self, step: Callable[[torch.nn.Parameter], None]) -> None:
        """Runs ``step(param)`` on the host master with the host gradient as ``.grad``, then drops the gradient.

        The fused optimizer step of an optimizer-offloaded weight, called once its gradient is complete in backward
        (the weight may still be loaded: its device copy is bound again afterwards, stale but read by nothing, as
        autograd needs a weight no more once its gradient is accumulated). Waits for that gradient's copy.
        """
        self._finish_grad_copy()
        if self.host_grad is None:
            return
        bound = self.param.data
        self.param.data = self.master
        self.param.grad, self.host_grad = self.host_grad, None
        try:
            step(self.param)
        finally:
            self.param.grad = None
            self.param.data = bound

    def publish_grad(self) -> None:
        """Hands the host gradient to ``param.grad`` for the optimizer (the weight must be unloaded)."""
        if not self.is_loaded:
            self._finish_grad_copy()
            if self.host_grad is not None:
                self.param.grad, self.host_grad = self.host_grad, None

    def restore(self) -> None:
        self.publish_grad()
        self._hook.remove()
        self.param.data = torch.empty_like(self.master, device=self.original_device).copy_(self.master)
        if self.param.grad is not None and self.param.grad.device != self.original_device:
            self.param.grad = self.param.grad.to(self.original_device)


class AlwaysOnDeviceParamOffloader(TensorOffloader):
    """A trainable parameter (or an unmanageable tensor) that moves to the device once and stays there.

    Right for LoRA: the trainable weights are small, and keeping them and their optimizer state on the device
    avoids a transfer per step.
    """

    def __init__(self, param: torch.nn.Parameter, device: torch.device, meter: ResidencyMeter) -> None:
        super().__init__(param, device, meter)
        self.param = param
        param.data = param.data.to(device)
        if param.grad is not None:
            param.grad = param.grad.to(device)

    def restore(self) -> None:
        self.param.data = self.param.data.to(self.original_device)
        if self.param.grad is not None:
            self.param.grad = self.param.grad.to(self.original_device)


class BufferOffloader(TensorOffloader):
    """A module buffer: a host master, re-pointed to a device copy while in use.

    Args:
        slots: Every ``(module, name)`` under which this buffer is registered.
        resident: Keep a device copy for good (for buffers whose module's forward is never called).
    """

    counts_toward_residency = True

    def __init__(self, buffer: torch.Tensor, slots: list[tuple[torch.nn.Module, str]], device: torch.device,
                 meter: ResidencyMeter, pool: BaseBufferPool, device_pool: DeviceBufferPool | None = None) -> None:
        super().__init__(buffer, device, meter, device_pool)
        self.slots = slots
        self.master = pool.allocate_like(buffer)
        self._point_slots_at(self.master)

    def _point_slots_at(self, tensor: torch.Tensor) -> None:
        for module, name in self.slots:
            module._buffers[name] = tensor

    def _load(self, deferred: list[CopyPair] | None) -> None:
        self.device_copy = self._copy_of(self.master, deferred)

    def _bind(self) -> None:
        self._point_slots_at(self.device_copy)

    def _unload(self) -> None:
        if self._may_have_changed():
            self.master.copy_(self.device_copy)
        self._point_slots_at(self.master)

    def _may_have_changed(self) -> bool:
        # In-place running-statistics updates (BatchNorm) do not bump the version counter, so persistent buffers of
        # modules in training mode are written back unconditionally; caches (non-persistent buffers) never change.
        return any(module.training and name not in module._non_persistent_buffers_set for module, name in self.slots)

    def restore(self) -> None:
        self._point_slots_at(torch.empty_like(self.master, device=self.original_device).copy_(self.master))
