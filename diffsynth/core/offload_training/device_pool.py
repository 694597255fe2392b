"""Device buffers for the offload manager's weight copies: allocated once, then reused from one pass to the next.

Without a pool every load allocates a device tensor per weight and every unload frees it, a few hundred times per
step. The pool lends a free buffer of exactly the weight's byte size instead (flat bytes viewed as any dtype) and
takes it back on unload; it grows only while a size is short. Only sizes that recur in the model are pooled
(``recurring_sizes``): a size one tensor has (an embedding table) would keep its buffer for good, as if never
offloaded, so it goes through the caching allocator.

Two guards make reuse safe. Events: a buffer given back records an event on the current stream, and its next load
waits for it, so a copy never overwrites memory a kernel may still read. Escapes: a buffer is reused only if nothing
but the pool references its memory when it comes back; one that something kept a view of (a saved tensor the manager
did not see, a user's reference) is left to that reference, counted in ``escapes``, and replaced.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable
from typing import Any

import torch

from ..device import record_event, resolve_device, wait_event


def recurring_sizes(tensors: Iterable[torch.Tensor]) -> set[int]:
    """The byte sizes that at least two of ``tensors`` have: the sizes worth keeping buffers of."""
    counts = Counter(tensor.numel() * tensor.element_size() for tensor in tensors)
    return {nbytes for nbytes, count in counts.items() if count > 1 and nbytes > 0}


def _storage_use_count(storage: torch.UntypedStorage) -> int | None:
    """How many tensors (and Python storage objects) hold ``storage``; None where torch does not say."""
    counter = getattr(torch._C, "_storage_Use_Count", None)
    return counter(storage._cdata) if counter is not None else None


@dataclasses.dataclass
class DevicePoolStats:
    """Counters since the pool was built.

    Attributes:
        allocations: Buffers allocated on the device (each size's first uses, and replacements of escaped buffers).
        reuses: Loads served by a buffer given back earlier.
        escapes: Buffers that came back still referenced elsewhere and so were not reused.
        reserved_bytes: Bytes of the buffers the pool holds, in use or free.
        in_use_bytes: Bytes of the buffers currently lent out.
    """

    allocations: int = 0
    reuses: int = 0
    escapes: int = 0
    reserved_bytes: int = 0
    in_use_bytes: int = 0


@dataclasses.dataclass(eq=False)
class _Buffer:
    flat: torch.Tensor
    storage: torch.UntypedStorage
    free_event: Any = None
    lent_use_count: int | None = None


class DeviceBufferPool:
    """Device tensors for weight copies, kept by byte size and lent out again after each use.

    Args:
        device: Where the buffers live.
        sizes: The byte sizes to pool (``accepts``); None pools every size.
    """

    def __init__(self, device: str | torch.device, sizes: Collection[int] | None = None) -> None:
        self.device = resolve_device(device, "device")
        self._sizes = set(sizes) if sizes is not None else None
        self.stats = DevicePoolStats()
        self._free: dict[int, list[_Buffer]] = defaultdict(list)
        self._lent: dict[int, _Buffer] = {}

    def accepts(self, like: torch.Tensor) -> bool:
        """Whether copies of ``like`` come from this pool: a pooled size, and a non-empty, contiguous tensor."""
        nbytes = like.numel() * like.element_size()
        return nbytes > 0 and like.is_contiguous() and (self._sizes is None or nbytes in self._sizes)

    def take(self, like: torch.Tensor) -> torch.Tensor:
        """A device tensor with ``like``'s shape and dtype (contiguous, contents undefined) to copy ``like`` into.

        The current stream is ordered behind the last use of the memory, so a copy queued on it (or on a stream that
        waits for it) may overwrite the buffer at once.
        """
        nbytes = like.numel() * like.element_size()
        free = self._free[nbytes]
        if free:
            buffer = free.pop()
            wait_event(self.device, buffer.free_event)
            buffer.free_event = None
            self.stats.reuses += 1
        else:
            flat = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            buffer = _Buffer(flat, flat.untyped_storage())
            self.stats.allocations += 1
            self.stats.reserved_bytes += nbytes
        view = buffer.flat.view(like.dtype).view(like.shape)
        # The count with only the pool's references and this one view: what ``give_back`` expects to find again.
        buffer.lent_use_count = _storage_use_count(buffer.storage)
        self._lent[buffer.storage.data_ptr()] = buffer
        self.stats.in_use_bytes += nbytes
        return view

    def give_back(self, view: torch.Tensor) -> bool:
        """Returns the buffer behind ``view`` (a tensor ``take`` lent) for reuse once the kernels queued so far ran.

        Drop every other reference to the weight's device copy first (a parameter's ``.data``, a buffer slot): the
        buffer is reused only if ``view`` is the last tensor on it.

        Returns:
            False when the buffer escaped: something else still references it, so it is left to that reference.
        """
        buffer = self._lent.pop(view.untyped_storage().data_ptr())
        self.stats.in_use_bytes -= buffer.flat.numel()
        count = _storage_use_count(buffer.storage)
        if count is None or count != buffer.lent_use_count:
            self.stats.escapes += 1
            self.stats.reserved_bytes -= buffer.flat.numel()
            return False
        buffer.free_event = record_event(self.device)
        self._free[buffer.flat.numel()].append(buffer)
        return True

    def owns(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` lives in a buffer this pool has lent out."""
        return tensor.device == self.device and tensor.untyped_storage().data_ptr() in self._lent

    def free_bytes(self) -> int:
        """Bytes of the buffers waiting for reuse."""
        return self.stats.reserved_bytes - self.stats.in_use_bytes

    def release_free(self) -> None:
        """Frees every buffer not lent out (back to the caching allocator); the pool grows again when needed."""
        for buffers in self._free.values():
            for buffer in buffers:
                self.stats.reserved_bytes -= buffer.flat.numel()
        self._free.clear()
