"""Transfer engines: how host bytes reach the compute device, behind one small interface, for every policy.

Policies only call ``submit``, ``wait``, ``synchronize`` and ``close``; every stream, event and thread lives here, so
the same residency code overlaps copies with compute on a GPU and runs, synchronously, on a CPU-only machine where the
tests exercise it. ``DirectEngine``: pinned sources, async copies on a copy stream (CUDA). ``StagedEngine``: pageable
sources, a worker thread memmoves them through a few staging buffers (pinned on CUDA). ``SyncEngine``: a plain copy
inside ``submit`` (any device).

Ordering contract, the same for every engine: ``submit`` writes its destinations only after all compute queued so far
on the device has run (on CUDA the copy stream waits for an event recorded on the compute stream at submit time), so a
caller may submit into a buffer as soon as it has *queued* the last computation that reads it; ``wait(key)`` orders
every computation queued afterwards behind that key's copy.

Byte-level helpers live here too: ``TensorSlot`` (re-pointing a parameter or a buffer at another tensor),
``byte_views`` (typed views into a flat buffer) and ``as_bytes``/``copy_bytes``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import time
from collections.abc import Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch import nn

from ..device import (
    allocate_host_bytes,
    new_stream,
    pinned_memory_available,
    record_event,
    use_stream,
    wait_event,
    warn_once,
)
from .memory_buffer import tensor_nbytes

ENGINES = ("auto", "direct", "staged", "sync")
"""Accepted engine names; ``auto`` picks ``direct`` (pinned masters) or ``staged`` on CUDA, ``sync`` elsewhere."""

DEFAULT_STAGING_BYTES = 64 * 1024 * 1024

CopyPair = tuple[torch.Tensor, torch.Tensor]
"""``(destination, source)``: two contiguous tensors of the same number of bytes."""


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor (no copy), so every copy is a plain byte copy."""
    if not tensor.is_contiguous():
        raise ValueError(f"block swap copies contiguous tensors only; got one with strides {tensor.stride()}")
    return tensor.reshape(-1).view(torch.uint8)


def copy_bytes(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> None:
    """Copies ``src`` into ``dst`` (flat uint8 tensors of equal size).

    Host-to-host copies use one ``memmove``: torch would split a large byte copy over its OpenMP threads, whose
    start-up and spinning cost more than the copy (about 10 ms for 40 KB on a busy 2-core machine) and compete with
    the compute threads.
    """
    if dst.device.type == "cpu" and src.device.type == "cpu":
        ctypes.memmove(dst.data_ptr(), src.data_ptr(), src.numel())
    else:
        dst.copy_(src, non_blocking=non_blocking)


@dataclasses.dataclass(eq=False)
class TensorSlot:
    """Where a moved tensor is bound: a parameter (re-pointed with ``.data``, so the ``Parameter`` object, its
    ``.grad`` and the optimizer's references stay the same) or a buffer (replaced in ``module._buffers``)."""

    name: str
    module: nn.Module
    attr: str
    is_param: bool

    def get(self) -> torch.Tensor:
        return (self.module._parameters if self.is_param else self.module._buffers)[self.attr]

    def bind(self, tensor: torch.Tensor) -> None:
        if self.is_param:
            self.module._parameters[self.attr].data = tensor
        else:
            self.module._buffers[self.attr] = tensor


def tensor_slots(module: nn.Module, prefix: str) -> list[TensorSlot]:
    """Every parameter and buffer under ``module`` (shared tensors once), named ``prefix.path.attr``."""
    slots, seen = [], set()
    for module_name, sub in module.named_modules(prefix=prefix):
        for tensors, is_param in ((sub._parameters, True), (sub._buffers, False)):
            for attr, tensor in tensors.items():
                if tensor is not None and id(tensor) not in seen:
                    seen.add(id(tensor))
                    name = f"{module_name}.{attr}" if module_name else attr
                    slots.append(TensorSlot(name, sub, attr, is_param))
    return slots


def byte_views(flat: torch.Tensor, like: list[torch.Tensor], offsets: list[int]) -> list[torch.Tensor]:
    """Views into a flat uint8 buffer with the dtypes and shapes of ``like``, at the given byte offsets."""
    return [flat[o:o + tensor_nbytes(t)].view(t.dtype).view(t.shape) for t, o in zip(like, offsets)]


@dataclasses.dataclass
class BlockTiming:
    """What one block's loads cost: copies issued, their time, and how long compute waited for them."""

    loads: int = 0
    copy_ms: float = 0.0
    waits: int = 0
    late: int = 0
    stall_ms: float = 0.0
    self_heals: int = 0


class TransferTimer:
    """Collects copy and stall durations per key.

    Host-side durations are added at once; CUDA event pairs are kept until ``resolve()`` (after a synchronisation),
    because reading an event's time before it has completed would block the host.
    """

    def __init__(self) -> None:
        self.blocks: dict[Hashable, BlockTiming] = {}
        self._events: list[tuple[Hashable, str, Any, Any]] = []

    def of(self, key: Hashable) -> BlockTiming:
        return self.blocks.setdefault(key, BlockTiming())

    def add_events(self, key: Hashable, field: str, start: Any, end: Any) -> None:
        self._events.append((key, field, start, end))

    def add_ms(self, key: Hashable, field: str, ms: float) -> None:
        timing = self.of(key)
        setattr(timing, field, getattr(timing, field) + ms)

    def resolve(self) -> None:
        """Turns the recorded CUDA event pairs into milliseconds; call after the device has been synchronised."""
        for key, field, start, end in self._events:
            self.add_ms(key, field, start.elapsed_time(end))
        self._events.clear()

    def format(self, title: str) -> str:
        """A table, one row per key and a total: loads, copy time, waits, late copies, stall time, self-heals."""
        fields = [field.name for field in dataclasses.fields(BlockTiming)]
        total = BlockTiming(*(sum(getattr(timing, name) for timing in self.blocks.values()) for name in fields))
        rows = [(str(key), self.blocks[key]) for key in sorted(self.blocks, key=str)] + [("total", total)]
        return "\n".join([title, f"{'block':>6} {'loads':>6} {'copy ms':>10} {'ms/load':>8} {'waits':>6} {'late':>5} "
                                 f"{'stall ms':>9} {'self-heal':>9}"] + [self._row(name, t) for name, t in rows])

    @staticmethod
    def _row(name: str, t: BlockTiming) -> str:
        per_load = t.copy_ms / t.loads if t.loads else 0.0
        return (f"{name:>6} {t.loads:>6} {t.copy_ms:>10.2f} {per_load:>8.3f} {t.waits:>6} {t.late:>5} "
                f"{t.stall_ms:>9.2f} {t.self_heals:>9}")


class TransferEngine:
    """The interface the residency logic uses. Keys name what a copy loads (a block index).

    Args:
        device: The compute device the destinations live on.
        timer: Where copy and stall times go; None records nothing (the default: timing costs events and syncs).
    """

    name = "base"

    def __init__(self, device: torch.device, timer: TransferTimer | None = None) -> None:
        self.device = device
        self.timer = timer

    def submit(self, key: Hashable, copies: Sequence[CopyPair]) -> None:
        """Starts copying each source into its destination, after all compute queued so far (see the module doc)."""
        raise NotImplementedError

    def wait(self, key: Hashable) -> None:
        """Orders the compute queued from now on behind ``key``'s last copy; a no-op if none is outstanding."""

    def synchronize(self) -> None:
        """Blocks the host until every submitted copy has completed."""

    def close(self) -> None:
        """Finishes outstanding copies and releases threads and streams."""
        self.synchronize()


class SyncEngine(TransferEngine):
    """Plain copies inside ``submit``: no stream, no thread, no overlap.

    The default without CUDA, so the residency logic runs everywhere. Compute is blocked for the whole copy, so its
    timing reports every copy's time as stall time too.

    Args:
        threaded_host_copy: Copy host to host with torch's copy (split over its threads) instead of one ``memmove``:
            faster for whole units of many tensors on an idle host, slower for a block's few large copies on a busy one.
    """

    name = "sync"

    def __init__(self, device: torch.device, timer: TransferTimer | None = None,
                 threaded_host_copy: bool = False) -> None:
        super().__init__(device, timer)
        self.threaded_host_copy = threaded_host_copy

    def submit(self, key: Hashable, copies: Sequence[CopyPair]) -> None:
        start = time.perf_counter()
        for dst, src in copies:
            if self.threaded_host_copy:
                dst.copy_(src)
            else:
                copy_bytes(as_bytes(dst), as_bytes(src))
        if self.timer is not None:
            elapsed = (time.perf_counter() - start) * 1e3
            timing = self.timer.of(key)
            timing.loads += 1
            timing.copy_ms += elapsed
            timing.stall_ms += elapsed


class DirectEngine(TransferEngine):
    """Async copies from pinned host memory on a private copy stream, one completion event per key.

    The fastest engine, for masters in pinned memory: the copy engine moves the bytes while kernels run, and the host
    never waits. Pageable sources still work, but the driver then copies them synchronously.

    Raises:
        ValueError: ``device`` is not a CUDA device.
    """

    name = "direct"

    def __init__(self, device: torch.device, timer: TransferTimer | None = None) -> None:
        if device.type != "cuda":
            raise ValueError(f"the 'direct' block swap transfer engine needs a CUDA device, got {device}; use 'sync' "
                             "or 'staged' (or 'auto', which picks 'sync' without CUDA)")
        super().__init__(device, timer)
        self._stream = new_stream(device)
        self._done: dict[Hashable, Any] = {}

    def submit(self, key: Hashable, copies: Sequence[CopyPair]) -> None:
        gate = record_event(self.device)
        timing = self.timer is not None
        with use_stream(self._stream):
            wait_event(self.device, gate)
            start = record_event(self.device, enable_timing=True) if timing else None
            for dst, src in copies:
                copy_bytes(as_bytes(dst), as_bytes(src), non_blocking=True)
            done = record_event(self.device, enable_timing=timing)
        self._done[key] = done
        if timing:
            self.timer.of(key).loads += 1
            self.timer.add_events(key, "copy_ms", start, done)

    def wait(self, key: Hashable) -> None:
        done = self._done.pop(key, None)
        if done is None:
            return
        if self.timer is None:
            wait_event(self.device, done)
            return
        _timed_wait(self.timer, key, self.device, done, late=not done.query())

    def synchronize(self) -> None:
        self._stream.synchronize()


def _timed_wait(timer: TransferTimer, key: Hashable, device: torch.device, done: Any, late: bool,
                host_ms: float = 0.0) -> None:
    # On CUDA the stall is the time the compute stream sits in wait_event, measured by events around it on that
    # stream (the host does not block); on the CPU it is the time the host blocked. ``late``: the copy had not
    # finished when compute reached it.
    timing = timer.of(key)
    timing.waits += 1
    timing.late += late
    timing.stall_ms += host_ms
    if done is not None:
        before = record_event(device, enable_timing=True)
        wait_event(device, done)
        timer.add_events(key, "stall_ms", before, record_event(device, enable_timing=True))


class StagedEngine(TransferEngine):
    """Pageable masters, copied by a worker thread through a few staging buffers.

    Pinning every master can cost tens of GB of page-locked memory; here only ``num_buffers`` staging buffers are
    pinned (on CUDA; pageable on the CPU, where the engine runs the same way for tests). Per chunk the worker memmoves
    the source into a free staging buffer and queues the copy to the device on its copy stream, so the host-side copy
    of the next chunk overlaps the DMA of the previous one, and the main thread never blocks on either.

    Args:
        device: The compute device.
        num_buffers: Staging buffers, used round-robin; one is reused only once the copy that read it has completed.
        buffer_bytes: Size of each staging buffer; larger copies go through in chunks.
        timer: Optional timing sink.
    """

    name = "staged"

    def __init__(self, device: torch.device, num_buffers: int = 2, buffer_bytes: int = DEFAULT_STAGING_BYTES,
                 timer: TransferTimer | None = None) -> None:
        if num_buffers < 1 or buffer_bytes < 1:
            raise ValueError(f"a staged engine needs num_buffers >= 1 and buffer_bytes >= 1, got {num_buffers} and "
                             f"{buffer_bytes}")
        super().__init__(device, timer)
        self._stream = new_stream(device)
        self._num_buffers = num_buffers
        self._buffer_bytes = buffer_bytes
        # Touched by the worker thread only: the staging buffers, the event that frees each, the next to use.
        self._buffers: list[torch.Tensor] = []
        self._free_events: list[Any] = [None] * num_buffers
        self._next = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="block-swap-staging")
        self._futures: dict[Hashable, Future] = {}

    def submit(self, key: Hashable, copies: Sequence[CopyPair]) -> None:
        gate = record_event(self.device)
        self._futures[key] = self._executor.submit(self._run, list(copies), gate)
        if self.timer is not None:
            self.timer.of(key).loads += 1

    def _run(self, copies: list[CopyPair], gate: Any) -> tuple[Any, Any, float]:
        pinned = self.device.type == "cuda"
        if not self._buffers:
            self._buffers = [allocate_host_bytes(self._buffer_bytes, pinned=pinned) for _ in range(self._num_buffers)]
        begin = time.perf_counter()
        timing = self.timer is not None
        with use_stream(self._stream):
            wait_event(self.device, gate)
            start = record_event(self.device, enable_timing=True) if timing else None
            for dst, src in copies:
                dst_bytes, src_bytes = as_bytes(dst), as_bytes(src)
                for offset in range(0, src_bytes.numel(), self._buffer_bytes):
                    count = min(self._buffer_bytes, src_bytes.numel() - offset)
                    index = self._next
                    self._next = (index + 1) % self._num_buffers
                    if self._free_events[index] is not None:
                        self._free_events[index].synchronize()
                    buffer = self._buffers[index]
                    # memmove (see copy_bytes) also releases the GIL, so the main thread keeps running meanwhile.
                    copy_bytes(buffer[:count], src_bytes[offset:offset + count])
                    copy_bytes(dst_bytes[offset:offset + count], buffer[:count], non_blocking=pinned)
                    self._free_events[index] = record_event(self.device)
            done = record_event(self.device, enable_timing=timing)
        return done, start, (time.perf_counter() - begin) * 1e3

    def wait(self, key: Hashable) -> None:
        future = self._futures.pop(key, None)
        if future is None:
            return
        late = not future.done()
        begin = time.perf_counter()
        done, start, host_copy_ms = future.result()
        blocked_ms = (time.perf_counter() - begin) * 1e3
        if self.timer is None:
            wait_event(self.device, done)
            return
        if done is None:
            self.timer.add_ms(key, "copy_ms", host_copy_ms)
        else:
            self.timer.add_events(key, "copy_ms", start, done)
        _timed_wait(self.timer, key, self.device, done, late, host_ms=blocked_ms if done is None else 0.0)

    def synchronize(self) -> None:
        for future in list(self._futures.values()):
            future.result()
        if self._stream is not None:
            self._stream.synchronize()

    def close(self) -> None:
        self.synchronize()
        self._executor.shutdown(wait=True)


def make_engine(name: str, device: torch.device, pinned_masters: bool, num_buffers: int = 2,
                buffer_bytes: int = DEFAULT_STAGING_BYTES, timer: TransferTimer | None = None,
                threaded_host_copy: bool = False) -> TransferEngine:
    """Builds the engine called ``name`` (one of ``ENGINES``) for ``device``.

    ``auto`` picks ``direct`` for pinned masters on CUDA (fastest; costs page-locked host memory for every streamed
    weight), ``staged`` for pageable masters on CUDA (only a few pinned buffers; a worker thread does the host copy),
    and ``sync`` without CUDA, saying so once in the log. ``threaded_host_copy`` is passed to ``SyncEngine``.
    """
    if name not in ENGINES:
        raise ValueError(f"block swap transfer engine {name!r} is unknown; choose one of {', '.join(ENGINES)}")
    if name == "auto":
        if device.type != "cuda":
            warn_once("block-swap-sync", f"block swap on {device}: no CUDA device, so weights are copied synchronously "
                                         "(transfer engine 'sync'), without overlapping compute")
            name = "sync"
        else:
            name = "direct" if pinned_masters and pinned_memory_available() else "staged"
    if name == "direct":
        return DirectEngine(device, timer)
    if name == "staged":
        return StagedEngine(device, num_buffers, buffer_bytes, timer)
    return SyncEngine(device, timer, threaded_host_copy)
