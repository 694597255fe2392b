"""Host memory for the CPU masters of offloaded weights.

Pinned (page-locked) host memory makes host-to-device copies asynchronous and roughly twice as fast, but PyTorch's
caching host allocator rounds every pinned allocation up to a power of two: pinning a model tensor by tensor costs
1.4x to 1.6x of its real size. ``PinnedArenaPool`` avoids that by planning, from one scan of the model, a few large
power-of-two chunks (each allocated without rounding loss) into which every tensor is packed at a 64-byte aligned
offset. Chunks are allocated lazily, the pool grows when a tensor was not planned for, and it falls back to one
allocation per tensor if a chunk cannot be had.

Frozen weights that already live in host memory the machine's processes share (``core/shared_weights``, loaded once
per machine) are their own masters: ``host_master`` returns them as they are, and arenas are planned without them.
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from ..device import allocate_host_bytes, warn_once
from ..shared_weights import is_shared_host

ALIGNMENT = 64
"""Every tensor starts at a multiple of this many bytes: enough for any dtype and for vectorised copies."""

MIN_GROWTH_BYTES = 1 << 21

HostAllocator = Callable[[int], torch.Tensor]
"""Returns a flat ``uint8`` tensor of the given number of bytes (pinned where possible)."""


def align(nbytes: int) -> int:
    """Rounds ``nbytes`` up to the arena alignment."""
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def next_power_of_two(nbytes: int) -> int:
    """The smallest power of two that is at least ``nbytes`` (1 for 0)."""
    return 1 << max(nbytes - 1, 0).bit_length()


def tensor_nbytes(tensor: torch.Tensor) -> int:
    """The bytes of a tensor's elements (not of its storage)."""
    return tensor.numel() * tensor.element_size()


def per_tensor_pinned_bytes(sizes: Iterable[int]) -> int:
    """What pinning each tensor separately costs under a power-of-two rounding allocator, for comparison."""
    return sum(next_power_of_two(n) for n in sizes if n > 0)


def _view_as(flat: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    return flat.view(dtype).view(shape)


class BaseBufferPool:
    """One host allocation per tensor: the simple scheme, and the pool's last resort.

    Args:
        allocator: Makes a flat uint8 host tensor of a given size. Defaults to pinned memory where available.
    """

    def __init__(self, allocator: HostAllocator | None = None) -> None:
        self._allocator = allocator or functools.partial(allocate_host_bytes, pinned=True)
        self.fallback_bytes = 0

    def allocate(self, nbytes: int) -> torch.Tensor:
        """Returns a flat uint8 host buffer of exactly ``nbytes``."""
        self.fallback_bytes += nbytes
        return self._allocator(nbytes)

    def empty_like(self, tensor: torch.Tensor) -> torch.Tensor:
        """Returns an uninitialised host tensor shaped like ``tensor``, living in this pool's memory."""
        return _view_as(self.allocate(tensor_nbytes(tensor)), tensor.shape, tensor.dtype)

    def allocate_like(self, tensor: torch.Tensor) -> torch.Tensor:
        """Returns a host copy of ``tensor`` living in this pool's memory."""
        host = self.empty_like(tensor)
        host.copy_(tensor.detach())
        return host

    def host_master(self, tensor: torch.Tensor) -> torch.Tensor:
        """The read-only host master of a frozen tensor: the tensor itself when it lives in a shared segment (one
        copy per machine, page-locked where CUDA is), else a copy in this pool."""
        return tensor.detach() if is_shared_host(tensor) else self.allocate_like(tensor)

    @property
    def reserved_bytes(self) -> int:
        """Host bytes this pool has taken so far."""
        return self.fallback_bytes


class PinnedBuffer:
    """A fixed-size chunk of host memory carved by a bump pointer; the memory is allocated on first use."""

    def __init__(self, capacity: int, allocator: HostAllocator) -> None:
        self.capacity = capacity
        self.used = 0
        self._allocator = allocator
        self._storage: torch.Tensor | None = None

    @property
    def is_allocated(self) -> bool:
        return self._storage is not None

    def bump(self, nbytes: int) -> int | None:
        """Reserves ``nbytes`` at the next aligned offset; returns the offset, or None when the chunk is full."""
        offset = align(self.used)
        if offset + nbytes > self.capacity:
            return None
        self.used = offset + nbytes
        return offset

    def view(self, offset: int, nbytes: int) -> torch.Tensor:
        """The flat bytes ``[offset, offset + nbytes)`` of this chunk, allocating the chunk if needed."""
        if self._storage is None:
            self._storage = self._allocator(self.capacity)
        return self._storage[offset : offset + nbytes]


def _best_fill(capacity: int, counts: Counter) -> Counter:
    """Chooses large tensors that fill ``capacity`` as tightly as a short search finds.

    Greedy largest-first leaves a gap of up to one tensor; trying fewer copies of the largest size before filling
    greedily closes most of it (the sizes of a transformer are few and repeat).
    """
    sizes = sorted(counts, reverse=True)
    largest = sizes[0]
    most = min(counts[largest], capacity // largest)
    best, best_gap = Counter(), capacity + 1
    for take_largest in range(most, max(most - 64, -1), -1):
        fill = Counter({largest: take_largest}) if take_largest else Counter()
        free = capacity - take_largest * largest
        for size in sizes[1:]:
            take = min(counts[size], free // size)
            if take:
                fill[size] = take
                free -= take * size
        if free < best_gap:
            best, best_gap = fill, free
            if free == 0:
                break
    return best


@dataclass
class ArenaPlan:
    """Chunk capacities, the bytes planned in each, and for each aligned size its slots ``(chunk, offset)``."""

    capacities: list[int]
    used: list[int]
    slots: dict[int, list[tuple[int, int]]]


@functools.lru_cache(maxsize=4096)
def _plan_large_chunks(counts_items: tuple[tuple[int, int], ...]) -> tuple[tuple[int, Counter], ...]:
    """Chooses chunks for the large tensors (``(size, count)`` pairs, sorted), least total gap first.

    At each step the remaining tensors either all go into one chunk of the next power of two, or the largest power of
    two they fill is filled as tightly as possible and the rest is planned the same way; the better of the two wins.
    Remembered by the multiset of sizes: the two branches meet the same remainders again, and the planner asks for
    the arenas of many overlapping sets of blocks; callers only read the Counters.
    """
    if not counts_items:
        return ()
    counts = Counter(dict(counts_items))
    remaining = sum(size * count for size, count in counts_items)
    single = next_power_of_two(remaining)
    best = ((single, counts),)
    best_gap = single - remaining
    for capacity in (single // 2, single // 4):
        if capacity < max(counts):
            break
        fill = _best_fill(capacity, counts)
        rest = _plan_large_chunks(tuple(sorted((counts - fill).items())))
        gap = capacity + sum(c for c, _ in rest) - remaining
        if gap < best_gap:
            best, best_gap = ((capacity, fill), *rest), gap
    return best


def plan_arena(sizes: Iterable[int]) -> ArenaPlan:
    """Packs tensors of the given byte sizes into power-of-two chunks.

    Large tensors go first, chunk by chunk (each chunk the largest power of two the remaining large tensors fill, or
    one last chunk holding them all when that wastes little); small tensors then fill the gaps best-fit, and what
    remains goes into a final small chunk.

    """
    items = sorted((align(n) for n in sizes if n > 0), reverse=True)
    if not items:
        return ArenaPlan([], [], {})
    large = Counter(n for n in items if n * 64 >= items[0])
    small = [n for n in items if n * 64 < items[0]]
    capacities: list[int] = []
    used: list[int] = []
    slots: dict[int, list[tuple[int, int]]] = defaultdict(list)

    def place(chunk: int, size: int) -> None:
        slots[size].append((chunk, used[chunk]))
        used[chunk] += size

    def open_chunk(capacity: int) -> int:
        capacities.append(capacity)
        used.append(0)
        return len(capacities) - 1

    for capacity, fill in _plan_large_chunks(tuple(sorted(large.items()))):
        chunk = open_chunk(capacity)
        for size, count in sorted(fill.items(), reverse=True):
            for _ in range(count):
                place(chunk, size)
    leftover = []
    for size in small:
        fitting = [c for c in range(len(capacities)) if capacities[c] - used[c] >= size]
        if fitting:
            place(min(fitting, key=lambda c: capacities[c] - used[c]), size)
        else:
            leftover.append(size)
    if leftover:
        chunk = open_chunk(next_power_of_two(sum(leftover)))
        for size in leftover:
            place(chunk, size)
    return ArenaPlan(capacities, used, dict(slots))


class PinnedArenaPool(BaseBufferPool):
    """Host masters packed into a few power-of-two chunks planned from the model.

    Args:
        sizes: Byte sizes of the tensors that will be allocated (usually from ``from_model``).
        allocator: Makes a flat uint8 host tensor of a given size; injectable so tests can drive the arena on the
            ``meta`` device. Defaults to pinned memory where available, pageable memory elsewhere.
    """

    def __init__(self, sizes: Iterable[int] = (), allocator: HostAllocator | None = None) -> None:
        super().__init__(allocator)
        plan = plan_arena(sizes)
        self._slots = plan.slots
        self.chunks = [PinnedBuffer(capacity, self._allocator) for capacity in plan.capacities]
        for chunk, used in zip(self.chunks, plan.used):
            chunk.used = used

    @classmethod
    def from_model(cls, model: torch.nn.Module, allocator: HostAllocator | None = None,
                   trainable_copies: int = 0) -> PinnedArenaPool:
        """Plans the arena for every frozen parameter and every buffer of ``model`` (tied tensors once; those in a
        shared segment not at all), and ``trainable_copies`` host tensors per trainable parameter (2 for optimizer
        offload: master and gradient)."""
        trainable = [p for p in model.parameters() if p.requires_grad]
        sizes = [tensor_nbytes(t) for t in frozen_tensors(model) if not is_shared_host(t)]
        sizes += [tensor_nbytes(p) for p in trainable for _ in range(trainable_copies)]
        return cls(sizes, allocator)

    def allocate(self, nbytes: int) -> torch.Tensor:
        places = self._slots.get(align(nbytes))
        if places:
            chunk, offset = places.pop()
            return self.chunks[chunk].view(offset, nbytes)
        for chunk in self.chunks:
            offset = chunk.bump(nbytes)
            if offset is not None:
                return chunk.view(offset, nbytes)
        return self._grow(nbytes)

    def _grow(self, nbytes: int) -> torch.Tensor:
        chunk = PinnedBuffer(next_power_of_two(max(nbytes, MIN_GROWTH_BYTES)), self._allocator)
        try:
            flat = chunk.view(chunk.bump(nbytes), nbytes)
        except RuntimeError as error:
            warn_once("arena-grow", f"could not allocate a {chunk.capacity}-byte host chunk ({error}); "
                                    "allocating host masters one tensor at a time")
            return super().allocate(nbytes)
        self.chunks.append(chunk)
        return flat

    @property
    def reserved_bytes(self) -> int:
        return sum(chunk.capacity for chunk in self.chunks) + self.fallback_bytes

    @property
    def allocated_bytes(self) -> int:
        """Host bytes actually allocated so far (chunks are allocated on first use)."""
        return sum(chunk.capacity for chunk in self.chunks if chunk.is_allocated) + self.fallback_bytes


def frozen_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """The parameters that need no gradient and the buffers of ``model``, each shared tensor once."""
    seen: set[int] = set()
    tensors = []
    for tensor in [p for p in model.parameters() if not p.requires_grad] + list(model.buffers()):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            tensors.append(tensor)
    return tensors
