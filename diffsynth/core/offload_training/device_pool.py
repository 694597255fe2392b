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

A load and an unload run for every tensor of every unit, a few hundred times per step, so both are O(1) and make no
tensor once warm: a buffer keeps the typed views it was lent as, and the escape check is one use count read against
the count recorded when the pool's own views were made. That is what makes the pool pay on the CPU too, where there
is no allocator churn to save: without it every load allocates and every unload tracks the freed copy
(``scripts/bench_unit_overhead.py``, modes ``ours pool`` and ``ours no pool``), so it is the default on every device.
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


_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


def _storage_use_count(cdata: int) -> int | None:
    """How many tensors (and Python storage objects) hold the storage at ``cdata``; None where torch does not say."""
    return _USE_COUNT(cdata) if _USE_COUNT is not None else None


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


class PooledBuffer:
    """One device buffer of the pool: flat bytes, and the typed views of it lent so far (kept, so that lending it
    again costs no view). ``tensor`` is the view to copy into while lent (``like``'s dtype and shape at ``take``)."""

    __slots__ = ("_cdata", "_idle_use_count", "_storage", "_views", "address", "flat", "free_event", "nbytes", "tensor")

    def __init__(self, flat: torch.Tensor) -> None:
        self.flat = flat
        self.nbytes = flat.numel()
        self.address = flat.data_ptr()
        self.free_event: Any = None
        self.tensor = flat
        self._storage = flat.untyped_storage()  # held, so that the count of what holds it stays the same
        self._cdata = self._storage._cdata
        self._views: dict[tuple[torch.dtype, torch.Size], torch.Tensor] = {}
        self._idle_use_count = _storage_use_count(self._cdata)

    def view_as(self, like: torch.Tensor) -> torch.Tensor:
        """The buffer as a contiguous tensor of ``like``'s dtype and shape (the same tensor each time)."""
        key = (like.dtype, like.shape)
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = self.flat.view(like.dtype).view(like.shape)
            # What ``give_back`` expects to find: the pool's own references (the flat tensor and its views) alone.
            self._idle_use_count = _storage_use_count(self._cdata)
        return view


class DeviceBufferPool:
    """Device tensors for weight copies, kept by byte size and lent out again after each use.

    Lending and taking back cost O(1) and create no tensor once a buffer has been lent for a dtype and shape.

    Args:
        device: Where the buffers live.
        sizes: The byte sizes to pool (``accepts``); None pools every size.
    """

    def __init__(self, device: str | torch.device, sizes: Collection[int] | None = None) -> None:
        self.device = resolve_device(device, "device")
        self._sizes = set(sizes) if sizes is not None else None
        self._events = self.device.type == "cuda"  # ordering on the GPU; the CPU runs every kernel at once
        self.stats = DevicePoolStats()
        self._free: dict[int, list[PooledBuffer]] = defaultdict(list)

    def accepts(self, like: torch.Tensor) -> bool:
        """Whether copies of ``like`` come from this pool: a pooled size, and a non-empty, contiguous tensor."""
        nbytes = like.numel() * like.element_size()
        return nbytes > 0 and like.is_contiguous() and (self._sizes is None or nbytes in self._sizes)

    def take(self, like: torch.Tensor) -> PooledBuffer:
        """A buffer of ``like``'s byte size whose ``tensor`` (``view_as(like)``, contents undefined) to copy ``like``
        into.

        The current stream is ordered behind the last use of the memory, so a copy queued on it (or on a stream that
        waits for it) may overwrite the buffer at once.
        """
        nbytes = like.numel() * like.element_size()
        free = self._free[nbytes]
        stats = self.stats
        if free:
            buffer = free.pop()
            if buffer.free_event is not None:
                wait_event(self.device, buffer.free_event)
                buffer.free_event = None
            stats.reuses += 1
        else:
            buffer = PooledBuffer(torch.empty(nbytes, dtype=torch.uint8, device=self.device))
            stats.allocations += 1
            stats.reserved_bytes += nbytes
        stats.in_use_bytes += nbytes
        view = buffer._views.get((like.dtype, like.shape))  # ``view_as`` without the call, once warm
        buffer.tensor = view if view is not None else buffer.view_as(like)
        return buffer

    def give_back(self, buffer: PooledBuffer) -> bool:
        """Returns ``buffer`` (one ``take`` lent) for reuse once the kernels queued so far ran.

        Drop every other reference to the weight's device copy first (a parameter's ``.data``, a buffer slot): the
        buffer is reused only if nothing but the pool holds it.

        Returns:
            False when the buffer escaped: something else still references it, so it is left to that reference.
        """
        stats = self.stats
        stats.in_use_bytes -= buffer.nbytes
        # Anything but the pool holding the memory (a parameter still bound to it, a kept view) counts; so does a
        # torch that cannot say.
        if _USE_COUNT is None or _USE_COUNT(buffer._cdata) != buffer._idle_use_count:
            stats.escapes += 1
            stats.reserved_bytes -= buffer.nbytes
            return False
        if self._events:
            buffer.free_event = record_event(self.device)
        self._free[buffer.nbytes].append(buffer)
        return True

    def free_bytes(self) -> int:
        """Bytes of the buffers waiting for reuse."""
        return self.stats.reserved_bytes - self.stats.in_use_bytes

    def release_free(self) -> None:
        """Frees every buffer not lent out (back to the caching allocator); the pool grows again when needed."""
        for buffers in self._free.values():
            for buffer in buffers:
                self.stats.reserved_bytes -= buffer.nbytes
        self._free.clear()
