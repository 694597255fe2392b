"""Transfer engines: exact copies, the staging worker on the CPU, engine choice, timing; the direct engine on CUDA."""

import logging
import threading

import pytest
import torch
from torch import nn

from diffsynth.core import device as device_helpers
from diffsynth.core.offload_training.transfer import (DirectEngine, StagedEngine, SyncEngine, TransferTimer, as_bytes,
                                                      byte_views, make_engine, tensor_slots)

CPU = torch.device("cpu")


def sources():
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(33, 17, generator=generator), torch.randn(300, generator=generator).to(torch.bfloat16),
            torch.randint(-9, 9, (5, 7), generator=generator), torch.tensor(3.25, dtype=torch.float64)]


def check_engine_copies_exactly(engine, device, rounds=3):
    """Several loads outstanding at once, then waited in another order: every destination equals its source."""
    pending = []
    for key in range(rounds):
        srcs = [s + key for s in sources()]
        dsts = [torch.empty_like(s, device=device) for s in srcs]
        engine.submit(key, list(zip(dsts, srcs)))
        pending.append((key, dsts, srcs))
    for key, dsts, srcs in reversed(pending):
        engine.wait(key)
        for dst, src in zip(dsts, srcs):
            assert torch.equal(dst.cpu(), src)
    engine.wait(rounds + 7)  # nothing outstanding: a no-op
    engine.close()


def test_sync_engine_copies_exactly():
    check_engine_copies_exactly(SyncEngine(CPU), CPU)


def test_staged_engine_copies_exactly_through_small_staging_buffers_on_the_cpu():
    # 64-byte staging buffers: every tensor above 64 bytes goes through in chunks, buffers are reused round-robin.
    check_engine_copies_exactly(StagedEngine(CPU, num_buffers=2, buffer_bytes=64), CPU)


def test_staged_engine_copies_on_its_worker_thread():
    engine = StagedEngine(CPU, num_buffers=1, buffer_bytes=1 << 20)
    seen = []
    original = engine._run

    def run(*args):
        seen.append(threading.current_thread().name)
        return original(*args)

    engine._run = run
    src = torch.arange(1000.0)
    dst = torch.empty_like(src)
    engine.submit("a", [(dst, src)])
    engine.wait("a")
    engine.close()
    assert torch.equal(dst, src) and seen and seen[0].startswith("block-swap-staging")


def test_engine_timing_counts_loads_waits_and_time():
    timer = TransferTimer()
    engine = StagedEngine(CPU, buffer_bytes=256, timer=timer)
    src = torch.randn(4096)
    for _ in range(2):
        engine.submit(5, [(torch.empty_like(src), src)])
        engine.wait(5)
    SyncEngine(CPU, timer).submit(6, [(torch.empty_like(src), src)])
    timing = timer.blocks
    assert (timing[5].loads, timing[5].waits, timing[6].loads, timing[6].waits) == (2, 2, 1, 0)
    assert timing[5].copy_ms > 0 and timing[6].stall_ms == timing[6].copy_ms > 0
    report = timer.format("title")
    assert report.splitlines()[0] == "title" and report.splitlines()[-1].split()[:2] == ["total", "3"]


def test_auto_engine_is_sync_without_cuda_and_says_so_once(caplog, monkeypatch):
    monkeypatch.setattr(device_helpers, "_warned", set())
    with caplog.at_level(logging.WARNING):
        assert isinstance(make_engine("auto", CPU, pinned_masters=True), SyncEngine)
        assert isinstance(make_engine("auto", CPU, pinned_masters=False), SyncEngine)
    assert sum("transfer engine 'sync'" in r.message for r in caplog.records) == 1
    assert isinstance(make_engine("staged", CPU, pinned_masters=False), StagedEngine)
    with pytest.raises(ValueError, match="'direct' block swap transfer engine needs a CUDA device"):
        make_engine("direct", CPU, pinned_masters=True)
    with pytest.raises(ValueError, match="engine 'dma' is unknown"):
        make_engine("dma", CPU, pinned_masters=True)


def test_device_stream_helpers_are_no_ops_on_the_cpu():
    assert device_helpers.new_stream(CPU) is None
    assert device_helpers.record_event(CPU) is None
    device_helpers.wait_event(CPU, None)
    with device_helpers.use_stream(None):
        pass


def test_byte_helpers():
    with pytest.raises(ValueError, match="contiguous"):
        as_bytes(torch.randn(4, 4).t())
    tensors = [torch.randn(3, 2), torch.arange(5, dtype=torch.int16)]
    flat = torch.zeros(128, dtype=torch.uint8)
    views = byte_views(flat, tensors, [0, 64])
    for view, tensor in zip(views, tensors):
        view.copy_(tensor)
        assert view.dtype == tensor.dtype and view.shape == tensor.shape
    assert torch.equal(flat[64:74].view(torch.int16), tensors[1])
    linear = nn.Linear(2, 2)
    linear.register_buffer("stat", torch.zeros(2))
    assert [(s.name, s.is_param) for s in tensor_slots(nn.Sequential(linear), "b")] == [
        ("b.0.weight", True), ("b.0.bias", True), ("b.0.stat", False)]


# ---- CUDA ----------------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["direct", "staged"])
def test_cuda_engines_copy_exactly(engine):
    cuda = torch.device("cuda", torch.cuda.current_device())
    made = make_engine(engine, cuda, pinned_masters=True, buffer_bytes=256)
    assert made.name == engine
    check_engine_copies_exactly(made, cuda)


@pytest.mark.gpu
def test_direct_engine_waits_for_compute_before_overwriting_and_times_the_copy():
    cuda = torch.device("cuda", torch.cuda.current_device())
    timer = TransferTimer()
    engine = DirectEngine(cuda, timer)
    size = 1 << 24
    slot = torch.zeros(size, device=cuda)
    first = torch.full((size,), 1.0).pin_memory()
    second = torch.full((size,), 2.0).pin_memory()
    engine.submit(0, [(slot, first)])
    engine.wait(0)
    # A long kernel reads the slot; the next copy into it must start only after that kernel.
    total = (slot.view(-1, 1024) @ torch.ones(1024, 256, device=cuda)).sum()
    engine.submit(1, [(slot, second)])
    engine.wait(1)
    assert total.item() == size * 256
    assert torch.equal(slot.cpu(), second)
    engine.synchronize()
    torch.cuda.synchronize()
    timer.resolve()
    assert timer.blocks[0].copy_ms > 0 and timer.blocks[1].waits == 1
