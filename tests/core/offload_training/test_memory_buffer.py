import logging

import pytest
import torch

from diffsynth.core import device as device_helper
from diffsynth.core.offload_training import (ALIGNMENT, BaseBufferPool, PinnedArenaPool, PinnedBuffer,
                                             per_tensor_pinned_bytes, plan_arena)
from diffsynth.core.offload_training.memory_buffer import frozen_tensors, tensor_nbytes


class RecordingAllocator:
    """Hands out meta (or CPU) buffers and remembers every request, so tests see what the pool asks for."""

    def __init__(self, device="meta", fail_above=None):
        self.device = device
        self.fail_above = fail_above
        self.requests = []

    def __call__(self, nbytes):
        if self.fail_above is not None and nbytes > self.fail_above and is_power_of_two(nbytes):
            raise RuntimeError("out of pinned memory")  # a large chunk is refused; exact small requests succeed
        self.requests.append(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)


def is_power_of_two(n):
    return n > 0 and n & (n - 1) == 0


def qwen_image_dit_sizes():
    from diffusers import QwenImageTransformer2DModel

    with torch.device("meta"):
        model = QwenImageTransformer2DModel(
            patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
            num_attention_heads=24, joint_attention_dim=3584, guidance_embeds=False, axes_dims_rope=(16, 56, 56),
        ).to(torch.bfloat16).requires_grad_(False)
    return [tensor_nbytes(t) for t in frozen_tensors(model)]


def test_arena_on_the_real_qwen_image_dit_wastes_almost_nothing():
    sizes = qwen_image_dit_sizes()
    assert len(sizes) == 1933 and 38.0 < sum(sizes) / 2**30 < 38.2
    allocator = RecordingAllocator()
    pool = PinnedArenaPool(sizes, allocator)
    for nbytes in sorted(sizes, reverse=True):
        flat = pool.allocate(nbytes)
        assert flat.numel() == nbytes
    exact = sum(sizes)
    overhead = pool.reserved_bytes - exact
    per_tensor = per_tensor_pinned_bytes(sizes)
    print(f"arena {pool.reserved_bytes / exact:.5f}x of exact ({len(pool.chunks)} chunks), "
          f"per-tensor power-of-two {per_tensor / exact:.3f}x")
    # Every large Qwen-Image tensor is a multiple of 9 * 2**21 bytes, so each power-of-two chunk leaves a remainder
    # the small tensors cannot fully fill: 0.103% is what the planner reaches here.
    assert overhead < 0.0011 * exact + ALIGNMENT * len(sizes)
    assert 1.55 < per_tensor / exact < 1.6
    assert all(is_power_of_two(c.capacity) for c in pool.chunks)
    assert sorted(allocator.requests) == sorted(c.capacity for c in pool.chunks)
    assert pool.fallback_bytes == 0


def test_chunks_are_allocated_lazily_and_slots_are_aligned_and_disjoint():
    sizes = [1000, 3000, 64, 1, 5000, 1000]
    allocator = RecordingAllocator(device="cpu")
    pool = PinnedArenaPool(sizes, allocator)
    assert allocator.requests == [] and pool.allocated_bytes == 0
    views = [pool.allocate(n) for n in sorted(sizes, reverse=True)]
    assert allocator.requests and all(is_power_of_two(n) for n in allocator.requests)
    spans = []
    for view in views:
        start = view.data_ptr()
        assert start % ALIGNMENT == 0
        spans.append((start, start + view.numel()))
    spans.sort()
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))


def test_allocate_like_copies_any_dtype_and_shape():
    tensors = [torch.randn(3, 5), torch.arange(7, dtype=torch.int64), torch.randn(4, dtype=torch.complex64),
               torch.randn(2, 2).to(torch.bfloat16), torch.tensor([True, False]), torch.empty(0)]
    pool = PinnedArenaPool([tensor_nbytes(t) for t in tensors], RecordingAllocator(device="cpu"))
    for tensor in tensors:
        copy = pool.allocate_like(tensor)
        assert copy.dtype == tensor.dtype and copy.shape == tensor.shape and torch.equal(copy, tensor)


def test_unplanned_requests_use_free_space_then_grow():
    pool = PinnedArenaPool([4096], RecordingAllocator(device="cpu"))
    pool.allocate(4096)
    before = len(pool.chunks)
    pool.allocate(100)
    pool.allocate(5 * 2**20)
    assert len(pool.chunks) > before
    assert all(is_power_of_two(c.capacity) for c in pool.chunks)


def test_growth_failure_falls_back_to_one_allocation_per_tensor(caplog):
    allocator = RecordingAllocator(device="cpu", fail_above=2**22)
    pool = PinnedArenaPool([], allocator)
    flat = pool.allocate(3 * 2**20 + 1)  # the growth chunk (4 MiB) fits: arena
    assert pool.fallback_bytes == 0 and flat.numel() == 3 * 2**20 + 1
    with caplog.at_level(logging.WARNING):
        flat = pool.allocate(5 * 2**20)  # an 8 MiB chunk is refused: per-tensor
    assert flat.numel() == 5 * 2**20 and pool.fallback_bytes == 5 * 2**20
    assert "one tensor at a time" in caplog.text


def test_base_pool_allocates_each_tensor_separately():
    allocator = RecordingAllocator(device="cpu")
    pool = BaseBufferPool(allocator)
    tensor = torch.randn(10)
    assert torch.equal(pool.allocate_like(tensor), tensor)
    assert allocator.requests == [40] and pool.reserved_bytes == 40


def test_plan_packs_every_tensor_within_its_chunks():
    sizes = [96, 96, 4000, 70000, 70000, 130, 7, 2**16]
    plan = plan_arena(sizes)
    planned = sorted((size for size, slots in plan.slots.items() for _ in slots), reverse=True)
    assert len(planned) == len(sizes)
    for chunk, capacity in enumerate(plan.capacities):
        slots = sorted((offset, size) for size, places in plan.slots.items() for c, offset in places if c == chunk)
        end = 0
        for offset, size in slots:
            assert offset >= end and offset % ALIGNMENT == 0
            end = offset + size
        assert end <= capacity and plan.used[chunk] == end


def test_pinned_buffer_bump_pointer():
    buffer = PinnedBuffer(256, RecordingAllocator(device="cpu"))
    assert buffer.bump(10) == 0 and buffer.bump(10) == 64 and buffer.bump(128) == 128
    assert buffer.bump(1) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_default_allocator_falls_back_to_pageable_memory_and_says_so_once(caplog, monkeypatch):
    monkeypatch.setattr(device_helper, "_warned", set())
    with caplog.at_level(logging.WARNING):
        pool = PinnedArenaPool([100, 200])
        a = pool.allocate_like(torch.ones(25))
        b = pool.allocate_like(torch.ones(50))
    assert not a.is_pinned() and torch.equal(a, torch.ones(25)) and torch.equal(b, torch.ones(50))
    assert caplog.text.count("pinned host memory is unavailable") == 1
