"""What each residency policy holds on the device and moves per step, predicted from a weightless model.

The prediction of a policy is the value its ``ResidencyMeter`` will reach (``peak_resident_bytes``,
``peak_swapped_bytes``), the host-to-device and device-to-host bytes it copies per training step, and the host memory
its masters take. Block swap follows a fixed schedule, so closed formulas give it exactly (derived in the functions'
docstrings from ``classic_swap.py`` and ``h2d_stream.py``). Per-leaf offload depends on the order in which autograd
runs the units and on which unit inputs need gradients, so it is simulated: the real ``OffloadTrainingManager`` runs
two steps of the model on the meta device, with masters that take no memory (``simulate_leaf_offload``; the
planner runs it on shallow copies of a deep model, ``shallow.py``); the host memory of its masters follows from the
whole model's tensor sizes (``leaf_offload_host``).

With several processes on a machine the frozen weights a policy keeps in host memory can live in one copy the
processes share (``--shared_host_weights``): the residency then also says how large that copy is (laid out exactly,
not in power-of-two chunks) and what each process still holds on its own.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Sequence

import torch
from torch import nn

from ..offload_training.block_swap import is_adapter_parameter, streaming_block_indices
from ..offload_training.manager import OffloadTrainingManager
from ..offload_training.memory_buffer import ArenaPlan, BaseBufferPool, align, frozen_tensors, plan_arena, tensor_nbytes
from ..offload_training.transfer import tensor_slots
from .footprint import meta_autocast


@dataclasses.dataclass
class Residency:
    """One policy's weights in motion.

    Attributes:
        peak_bytes: The most weight bytes the policy holds on the device at once (its residency meter's peak).
        moved_bytes: Host-to-device weight bytes per training step, once the schedule is warm.
        returned_bytes: Device-to-host weight bytes per step (classic block swap copies blocks back out).
        host_bytes: Host memory of the masters (a pinned arena's chunks, or the packed bytes when pageable).
        offloaded_bytes: Weight bytes that no longer sit on the device for good.
        build_peak_bytes: Host memory at the worst moment of building the masters from a model loaded in host
            memory: the arena's chunks are allocated while the loaded tensors they replace still exist.
        shared_bytes: With a host copy shared by the machine's processes: its bytes (the frozen masters, loaded into
            it directly, once per machine).
        private_host_bytes: Then, the host memory of the masters each process still holds (buffers, trainable).
        private_build_peak_bytes: Then, each process's host memory at its worst moment: the loaded tensors that are
            not shared (block swap moves the resident blocks to the device after loading them) or the arena of the
            private masters.
    """

    peak_bytes: int
    moved_bytes: int
    returned_bytes: int
    host_bytes: int
    offloaded_bytes: int
    build_peak_bytes: int
    shared_bytes: int
    private_host_bytes: int
    private_build_peak_bytes: int


def arena_bytes(sizes: Sequence[int], pinned: bool) -> int:
    """Host bytes of a ``PinnedArenaPool`` holding tensors of ``sizes``: its planned power-of-two chunks when pinned
    (page-locked memory is resident in full), the 64-byte aligned sizes when pageable (untouched pages cost nothing)."""
    if pinned:
        return sum(_arena_plan(tuple(sizes)).capacities)
    return sum(align(size) for size in sizes if size > 0)


@functools.lru_cache(maxsize=256)
def _arena_plan(sizes: tuple[int, ...]) -> ArenaPlan:
    # The planner asks for the same arenas under each checkpointing mode, and for its size and its building alike.
    return plan_arena(sizes)


def build_peak(copies: Sequence[int], loaded_bytes: int, pinned: bool) -> int:
    """Host bytes at the worst moment of copying tensors of sizes ``copies`` (in that order) into a fresh arena while
    ``loaded_bytes`` of loaded model sit in host memory, each loaded tensor freed once copied.

    Mirrors ``PinnedArenaPool``: each copy takes a slot of its size in a planned chunk; a pinned chunk is resident in
    full from its first use, a pageable one only where written.
    """
    allocated, peak, remaining, opened = 0, loaded_bytes, loaded_bytes, set()
    if not pinned:  # pageable chunks are resident only where written: the chunk plan does not matter
        for size in copies:
            if size > 0:
                allocated += align(size)
                peak = max(peak, remaining + allocated)
                remaining -= size
        return peak
    plan = _arena_plan(tuple(copies))
    slots = {size: list(places) for size, places in plan.slots.items()}
    for size in copies:
        if size <= 0:
            continue
        chunk, _ = slots[align(size)].pop()
        if chunk not in opened:
            opened.add(chunk)
            allocated += plan.capacities[chunk]
        peak = max(peak, remaining + allocated)
        remaining -= size
    return peak


def swap_sizes(blocks: Sequence[nn.Module]) -> list[list[int]]:
    """Per block, the bytes of each tensor classic block swap moves: buffers and parameters that need no gradient."""
    return [[tensor_nbytes(slot.get()) for slot in tensor_slots(block, "")
             if not (slot.is_param and slot.get().requires_grad)] for block in blocks]


def stream_sizes(blocks: Sequence[nn.Module]) -> list[tuple[int, int]]:
    """Per block, ``(packed, raw)`` bytes of the weights H2D streaming packs into one master: its parameters but the
    LoRA's, each at a 64-byte aligned offset (``packed``, what a ring slot holds) and summed as they are (``raw``)."""
    sizes = []
    for block in blocks:
        packed = raw = 0
        for name, param in block.named_parameters():
            if not is_adapter_parameter(name):
                packed = align(packed) + tensor_nbytes(param)
                raw += tensor_nbytes(param)
        sizes.append((packed, raw))
    return sizes


def classic_swap_residency(sizes: Sequence[Sequence[int]], blocks_to_swap: int, checkpointing: bool,
                           pinned: bool = False, loaded_bytes: int = 0) -> Residency:
    """Classic block swap of the last ``blocks_to_swap`` blocks, from ``swap_sizes(blocks)``.

    With checkpointing a swapped block is loaded for its forward together with the next one (prefetched), evicted
    after it, and loaded again for recompute and backward together with the previous one: at most two adjacent
    swapped blocks are on the device, and each crosses the bus twice per step each way. Without checkpointing autograd
    holds a block's weights until its backward, so every swapped block stays loaded from its forward on: all of them
    at the end of the forward, each loaded once. ``loaded_bytes``: the model loaded in host memory before the masters
    are built.
    """
    swapped = sizes[len(sizes) - blocks_to_swap:]
    totals = [sum(block) for block in swapped]
    peak = max([a + b for a, b in itertools.pairwise(totals)] or totals) if checkpointing else sum(totals)
    trips = 2 if checkpointing else 1
    tensors = tuple(size for block in swapped for size in block)
    # Shared, the swapped blocks' tensors (buffers, rare in blocks, counted with the weights) are laid out in place.
    host, building, shared = _masters_host(tensors, loaded_bytes, pinned)
    return Residency(peak, trips * sum(totals), trips * sum(totals), host, sum(totals), building, shared, 0,
                     max(loaded_bytes - sum(totals), 0))


@functools.lru_cache(maxsize=512)
def _masters_host(sizes: tuple[int, ...], loaded_bytes: int, pinned: bool) -> tuple[int, int, int]:
    # A block-swapped model's masters: the arena, its building's peak and the shared copy's bytes, which the planner
    # asks for again under each checkpointing mode and ring size.
    return arena_bytes(sizes, pinned), build_peak(sizes, loaded_bytes, pinned), sum(align(size) for size in sizes)


def h2d_ring_residency(sizes: Sequence[tuple[int, int]], blocks_to_swap: int, ring_size: int,
                       pinned: bool = False, loaded_bytes: int = 0) -> Residency:
    """H2D-only streaming of ``blocks_to_swap`` evenly spaced blocks through ``ring_size`` slots, from
    ``stream_sizes(blocks)``.

    The ring is allocated once: B slots of the largest streamed block's packed weights. In a training step rank k's
    forward loads rank k + B and rank k's backward loads rank k - B, so ranks B..S-1 cross once in the forward and
    ranks 0..S-B-1 once in the backward; nothing is copied back.
    """
    streamed = [sizes[index] for index in streaming_block_indices(len(sizes), blocks_to_swap)]
    packed = tuple(size for size, _ in streamed)
    ring = min(ring_size, len(packed))
    moved = sum(packed[ring:]) + sum(packed[:len(packed) - ring])
    raw = sum(size for _, size in streamed)
    host, building, _ = _masters_host(packed, loaded_bytes, pinned)
    # The shared copy lays each block out as the ring packs it, so its span is the master.
    return Residency(ring * max(packed), moved, 0, host, raw, building, sum(packed), 0, max(loaded_bytes - raw, 0))


def _meta_pool() -> BaseBufferPool:
    return BaseBufferPool(allocator=functools.partial(torch.empty, dtype=torch.uint8, device="meta"))


@dataclasses.dataclass
class OffloadSchedule:
    """What per-leaf offload's simulation finds: the most weight bytes on the device at once, the host-to-device
    bytes of a warm step, and the bytes of the offloaded weights."""

    peak_bytes: int
    moved_bytes: int
    offloaded_bytes: int


def simulate_leaf_offload(model: nn.Module, step: Callable[[], torch.Tensor], prefetch_depth: int = 0,
                          optimizer_offload: bool = False, split_threshold_mb: float | None = None) -> OffloadSchedule:
    """Runs the offload manager for two steps of ``model`` (on the meta device, with masters that take no memory).

    The first step records the execution order, the second prefetches along it; the meter's peak over both and the
    second step's copies are the schedule. ``model`` is left as it was (``remove()``). Arguments as for
    ``leaf_offload_residency``.
    """
    device = next(model.parameters()).device
    # An earlier dry run's gradients (full training) are meta tensors the manager could not move to the host.
    model.zero_grad(set_to_none=True)
    manager = OffloadTrainingManager(model, device, enable_optimizer_cpu_offload=optimizer_offload,
                                     cpu_offload_split_threshold=split_threshold_mb, pool=_meta_pool(),
                                     prefetch_depth=prefetch_depth, reuse_device_buffers=False)
    moving = [o for o in manager._offloaders.values() if o.counts_toward_residency]
    try:
        with meta_autocast():
            for _ in range(2):
                before = sum(o.nbytes * o.load_count for o in moving)
                step().backward()
                manager.after_backward()
        moved = sum(o.nbytes * o.load_count for o in moving) - before
        return OffloadSchedule(manager.peak_resident_bytes, moved, sum(o.nbytes for o in moving))
    finally:
        manager.remove()


def leaf_offload_host(model: nn.Module, schedule: OffloadSchedule, optimizer_offload: bool = False,
                      pinned: bool = True) -> Residency:
    """Per-leaf offload's residency: ``schedule`` (``simulate_leaf_offload``) with the host memory of ``model``'s
    masters, from its tensor sizes."""
    # The order the manager fills its arena in: frozen tensors largest first, then trainable masters and staging.
    sizes = sorted((tensor_nbytes(t) for t in frozen_tensors(model)), reverse=True)
    trainable = [tensor_nbytes(p) for p in model.parameters() if p.requires_grad for _ in range(2 * optimizer_offload)]
    sizes += trainable
    # Shared, the frozen parameters are their own masters; the arena keeps the buffers and the trainable copies.
    frozen_params = [tensor_nbytes(p) for p in model.parameters() if not p.requires_grad]
    private = sorted((tensor_nbytes(b) for b in {id(b): b for b in model.buffers()}.values()), reverse=True)
    private += trainable
    loaded = sum(tensor_nbytes(t) for t in {id(t): t for t in [*model.parameters(), *model.buffers()]}.values())
    return Residency(schedule.peak_bytes, schedule.moved_bytes, 0, arena_bytes(sizes, pinned),
                     schedule.offloaded_bytes, build_peak(sizes, loaded, pinned),
                     sum(align(size) for size in frozen_params), arena_bytes(private, pinned),
                     build_peak(private, loaded - sum(frozen_params), pinned))


def leaf_offload_residency(model: nn.Module, step: Callable[[], torch.Tensor], prefetch_depth: int = 0,
                           optimizer_offload: bool = False, split_threshold_mb: float | None = None,
                           pinned: bool = True) -> Residency:
    """Per-leaf offload, simulated (``simulate_leaf_offload``), with its masters' host memory (``leaf_offload_host``).

    Args:
        model: The model, with its LoRA injected and checkpointing set as in the run, on the meta device.
        step: Runs the forward on meta inputs and returns a scalar loss.
        prefetch_depth: K of the run (1 on CUDA by default).
        optimizer_offload: ``--enable_optimizer_cpu_offload``.
        split_threshold_mb: ``--cpu_offload_split_threshold``.
        pinned: Whether the run's host arena is pinned (on CUDA).
    """
    schedule = simulate_leaf_offload(model, step, prefetch_depth, optimizer_offload, split_threshold_mb)
    return leaf_offload_host(model, schedule, optimizer_offload, pinned)
