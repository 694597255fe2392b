"""Prefetch in the offload manager: the recorded order, hits, order changes, the residency bound, one copy per use.

On the CPU the schedule runs with a synchronous engine, so everything but the overlap itself is checked here.
"""

import copy

import pytest
import torch
from peft import LoraConfig
from torch import nn

from diffsynth.core import OffloadTrainingManager, gradient_checkpoint_forward
from diffsynth.core.offload_training import PrefetchScheduler, StaticParamOffloader, TrainableParamOffloader

from .models import make_batches, make_model
from .test_diffusers_models import lora_train, tiny_qwen_image, tiny_wan
from .test_manager import MODES, assert_same, state, train

DEPTHS = [1, 2]
SKIPPABLE = 1


class Chain(nn.Module):
    """Linear layers of different widths, each its own unit, optionally checkpointed one by one.

    ``skip(call)`` names a layer (the square one, ``SKIPPABLE``) to leave out of that forward call, or None.
    """

    def __init__(self, checkpointing: bool = False, skip=None) -> None:
        super().__init__()
        widths = (8, 24, 24, 40, 8)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.checkpointing = checkpointing
        self.skip = skip
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skipped = self.skip(self.calls) if self.skip is not None else None
        self.calls += 1
        for index, layer in enumerate(self.layers):
            if index != skipped:
                x = torch.tanh(gradient_checkpoint_forward(layer, self.checkpointing, False, x))
        return x


def make_chain(seed=0, train_last=True, **kwargs):
    """A chain whose layers are frozen, but for the last one with ``train_last``."""
    torch.manual_seed(seed)
    chain = Chain(**kwargs).requires_grad_(False)
    chain.layers[-1].requires_grad_(train_last)
    return chain


def chain_batches(steps, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(6, 8, generator=generator) for _ in range(steps)]


def chain_train(model, batches, manager=None, after_step=None):
    """AdamW steps on a regression loss; the input needs a gradient, so every layer has a backward boundary."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-2) if trainable else None
    losses = []
    for x in batches:
        loss = model(x.clone().requires_grad_(True)).square().mean()
        loss.backward()
        if manager is not None:
            manager.after_backward()
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad()
        losses.append(loss.detach())
        if after_step is not None:
            after_step()
    return torch.stack(losses)


def unit_bytes(manager):
    return sorted((u.offloaded_nbytes for u in manager.units), reverse=True)


def expected_chain_order(num_layers, checkpointing, skipped=None, trained_last=False):
    """The chain's events; a trained last layer stays on the device, so it is no unit and has none."""
    layers = [f"layers.{i}" for i in range(num_layers - trained_last) if i != skipped]
    order = [("forward", name) for name in layers]
    for name in reversed(layers):
        order += [("backward", name), ("recompute", name)] if checkpointing else [("backward", name)]
    return order


@pytest.fixture
def bounded_prefetch(monkeypatch):
    """Checks, at every unit event, that at most K units are prefetched and not used yet."""
    seen = []
    original = PrefetchScheduler.demand

    def demand(self, unit, phase):
        original(self, unit, phase)
        assert len(self.prefetched_units) <= self.depth, self.prefetched_units
        seen.append(len(self.prefetched_units))

    monkeypatch.setattr(PrefetchScheduler, "demand", demand)
    return seen


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
@pytest.mark.parametrize("mode", MODES)
def test_training_with_prefetch_matches_plain_training_bitwise(mode, checkpointing, depth, bounded_prefetch):
    batches = make_batches(4)
    reference = make_model(use_gradient_checkpointing=checkpointing)
    offloaded = copy.deepcopy(reference)
    expected_losses = train(reference, batches)

    manager = OffloadTrainingManager(offloaded, "cpu", prefetch_depth=depth, **mode)
    losses = train(offloaded, batches, manager)
    stats = manager.prefetch_stats
    manager.remove()

    assert torch.equal(expected_losses, losses)
    assert_same(state(reference), state(offloaded))
    assert offloaded.head.weight is offloaded.embed.weight
    assert stats.hits > 0 and stats.order_changes == 0 and stats.dropped == 0


@pytest.mark.parametrize("depth", [0, *DEPTHS])
@pytest.mark.parametrize("optimizer_offload", [False, True], ids=["frozen-offload", "optimizer-offload"])
def test_chain_with_prefetch_matches_plain_and_unprefetched_training(optimizer_offload, depth):
    batches = chain_batches(4)
    reference = make_chain(checkpointing=True)
    offloaded = copy.deepcopy(reference)
    expected = chain_train(reference, batches)
    manager = OffloadTrainingManager(offloaded, "cpu", enable_optimizer_cpu_offload=optimizer_offload,
                                     prefetch_depth=depth)
    losses = chain_train(offloaded, batches, manager)
    manager.remove()
    assert torch.equal(expected, losses)
    assert_same(state(reference), state(offloaded))


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("build", [tiny_qwen_image, tiny_wan], ids=["qwen-image", "wan"])
@pytest.mark.parametrize("options", [{}, dict(enable_optimizer_cpu_offload=True)],
                         ids=["frozen-offload", "optimizer-offload"])
def test_lora_training_of_diffusers_models_with_checkpointing_and_prefetch(build, options, depth):
    base, targets, inputs = build()
    base.requires_grad_(False)
    base.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=targets, init_lora_weights="gaussian"))
    base.enable_gradient_checkpointing()
    offloaded = copy.deepcopy(base)
    expected = lora_train(base, inputs, steps=3)
    manager = OffloadTrainingManager(offloaded, "cpu", prefetch_depth=depth, **options)
    losses = lora_train(offloaded, inputs, steps=3, manager=manager)
    stats = manager.prefetch_stats
    assert stats.hits > 0 and stats.order_changes == 0
    assert any(phase == "recompute" for phase, _ in manager.execution_order())
    manager.remove()
    torch.testing.assert_close(losses, expected, rtol=0, atol=1e-6)
    expected_weights = {name: p for name, p in base.named_parameters() if p.requires_grad}
    weights = {name: p for name, p in offloaded.named_parameters() if name in expected_weights}
    torch.testing.assert_close(weights, expected_weights, rtol=0, atol=1e-6)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_the_recorded_order_is_forward_then_backward_with_recompute(checkpointing):
    model = make_chain(train_last=False, checkpointing=checkpointing)
    manager = OffloadTrainingManager(model, "cpu", prefetch_depth=1)
    assert manager.execution_order() == []
    chain_train(model, chain_batches(1), manager)
    assert manager.execution_order() == expected_chain_order(len(model.layers), checkpointing)
    assert manager.prefetch_stats.hits == 0 and manager.prefetch_stats.prefetches == 0


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_every_load_after_the_first_pass_is_a_prefetch_hit(checkpointing, depth):
    model = make_chain(train_last=False, checkpointing=checkpointing)
    manager = OffloadTrainingManager(model, "cpu", prefetch_depth=depth)
    chain_train(model, chain_batches(1), manager)
    first = copy.copy(manager.prefetch_stats)
    chain_train(model, chain_batches(3), manager)
    stats = manager.prefetch_stats
    assert stats.misses == first.misses, "a unit was loaded on the spot after the first pass"
    assert stats.hits > 0 and stats.order_changes == 0


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_residency_stays_within_the_largest_k_plus_one_units(checkpointing, depth, bounded_prefetch):
    model = make_chain(train_last=False, checkpointing=checkpointing)
    manager = OffloadTrainingManager(model, "cpu", prefetch_depth=depth)
    chain_train(model, chain_batches(4), manager)
    # The chain holds one unit at a time without prefetch (its input needs a gradient, so no unit waits for
    # after_backward), so K prefetched units on top make at most the K + 1 largest.
    assert manager.peak_resident_bytes <= sum(unit_bytes(manager)[:depth + 1])
    assert manager.peak_resident_bytes > unit_bytes(manager)[0]
    assert manager.resident_bytes == 0 and manager.live_device_copy_bytes() == 0


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_residency_adds_at_most_the_k_largest_units_to_what_the_manager_holds_anyway(checkpointing, depth):
    # The tied model legitimately holds more than one unit: the root unit while the model runs, a block's units from
    # its recompute to its backward, units whose inputs need no gradient until after_backward(). Prefetch adds at
    # most K units, never more than the K largest, to that.
    peaks = {}
    for k in (0, depth):
        model = make_model(use_gradient_checkpointing=checkpointing)
        manager = OffloadTrainingManager(model, "cpu", prefetch_depth=k)
        train(model, make_batches(3), manager)
        peaks[k] = manager.peak_resident_bytes
    assert peaks[0] < peaks[depth] <= peaks[0] + sum(unit_bytes(manager)[:depth])


@pytest.mark.parametrize("depth", [0, *DEPTHS])
@pytest.mark.parametrize("optimizer_offload", [False, True], ids=["frozen-offload", "optimizer-offload"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_each_weight_crosses_once_per_forward_and_once_per_recompute_and_backward(checkpointing, optimizer_offload,
                                                                                   depth):
    model = make_chain(checkpointing=checkpointing)
    manager = OffloadTrainingManager(model, "cpu", enable_optimizer_cpu_offload=optimizer_offload,
                                     prefetch_depth=depth)
    moved = [o for o in manager._offloaders.values() if isinstance(o, (StaticParamOffloader, TrainableParamOffloader))]
    assert len(moved) == (8 if optimizer_offload else 6)
    for x in chain_batches(3):
        before = {id(o): o.load_count for o in moved}
        chain_train(model, [x], manager)
        for offloader in moved:
            assert offloader.load_count - before[id(offloader)] in ((1, 2) if depth else (2,))


def test_a_prefetched_weight_stays_a_placeholder_until_its_unit_computes():
    # On CUDA the copy may still be running: whatever reads the weight before its unit's turn must fail loudly, as
    # without prefetch, instead of reading half-copied bytes.
    model = make_chain(train_last=False)
    manager = OffloadTrainingManager(model, "cpu", prefetch_depth=1)
    seen = []

    def record(module, args):  # runs after the manager's pre-hook: layer 0 is loaded and computes next
        if manager.prefetch_stats.passes:
            seen.append((manager._prefetch.prefetched_units, model.layers[1].weight.numel(),
                         model.layers[0].weight.numel()))

    model.layers[0].register_forward_pre_hook(record)
    chain_train(model, chain_batches(2), manager)
    assert seen == [(["layers.1"], 0, 8 * 24)]


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_a_forward_that_skips_a_unit_on_odd_steps_is_detected_and_stays_correct(checkpointing, depth,
                                                                               bounded_prefetch):
    def alternate(call):
        return SKIPPABLE if call % 2 else None

    batches = chain_batches(5)
    reference = make_chain(checkpointing=checkpointing, skip=alternate)
    offloaded = copy.deepcopy(reference)
    expected = chain_train(reference, batches)
    manager = OffloadTrainingManager(offloaded, "cpu", prefetch_depth=depth)
    orders = []
    losses = chain_train(offloaded, batches, manager, after_step=lambda: orders.append(manager.execution_order()))
    stats = manager.prefetch_stats
    assert manager.peak_resident_bytes <= sum(unit_bytes(manager)[:depth + 1])
    assert manager.resident_bytes == 0
    manager.remove()

    assert torch.equal(expected, losses)
    assert_same(state(reference), state(offloaded))
    num_layers = len(offloaded.layers)
    for step, order in enumerate(orders):
        # Re-recorded after every pass: the recorded order is always that of the pass that just ended.
        assert order == expected_chain_order(num_layers, checkpointing, alternate(step), trained_last=True)
    assert stats.order_changes == len(batches) - 1
    assert stats.hits > 0


@pytest.mark.parametrize("depth", DEPTHS)
def test_a_lasting_order_change_is_recorded_once_and_then_prefetched_again(depth):
    batches = chain_batches(6)
    reference = make_chain(checkpointing=True, skip=lambda call: SKIPPABLE if call >= 2 else None)
    offloaded = copy.deepcopy(reference)
    expected = torch.cat([chain_train(reference, batches[:3]), chain_train(reference, batches[3:])])
    manager = OffloadTrainingManager(offloaded, "cpu", prefetch_depth=depth)
    losses = chain_train(offloaded, batches[:3], manager)
    stats = copy.copy(manager.prefetch_stats)
    assert stats.order_changes == 1 and stats.dropped >= 1
    losses = torch.cat([losses, chain_train(offloaded, batches[3:], manager)])
    assert manager.prefetch_stats.order_changes == 1
    assert manager.prefetch_stats.misses == stats.misses and manager.prefetch_stats.hits > stats.hits
    assert torch.equal(expected, losses)
    assert manager.execution_order() == expected_chain_order(len(offloaded.layers), True, SKIPPABLE, trained_last=True)


def test_a_forward_only_pass_between_steps_ends_early_and_training_stays_correct():
    batches = chain_batches(4)
    reference = make_chain(checkpointing=True)
    offloaded = copy.deepcopy(reference)
    probe = torch.randn(3, 8)
    expected_probes = []
    expected = chain_train(reference, batches, after_step=lambda: expected_probes.append(reference(probe)))
    manager = OffloadTrainingManager(offloaded, "cpu", prefetch_depth=1)
    probes = []

    def validate():
        with torch.no_grad():
            probes.append(offloaded(probe))

    losses = chain_train(offloaded, batches, manager, after_step=validate)
    assert torch.equal(expected, losses)
    assert all(torch.equal(a, b) for a, b in zip(expected_probes, probes))
    # Training and validation passes alternate, so each pass differs from the one recorded before it.
    assert manager.prefetch_stats.order_changes == 2 * len(batches) - 2
    # The last pass ended is a training pass: recorded in full again (the open validation pass ends at the next
    # boundary).
    assert manager.execution_order() == expected_chain_order(len(offloaded.layers), True, trained_last=True)


def test_inference_passes_are_delimited_by_the_root_forward():
    model = make_chain(train_last=False).eval()
    reference = copy.deepcopy(model)
    manager = OffloadTrainingManager(model, "cpu", prefetch_depth=2)
    with torch.no_grad():
        for x in chain_batches(3):
            assert torch.equal(reference(x), model(x))
            assert manager.resident_bytes == 0 and manager.live_device_copy_bytes() == 0
    assert manager.prefetch_stats.hits > 0 and manager.prefetch_stats.order_changes == 0
    assert manager.prefetch_stats.misses == len(model.layers)


def test_a_pass_too_long_to_record_runs_without_prefetch(monkeypatch):
    monkeypatch.setattr("diffsynth.core.offload_training.prefetch.MAX_TRACE_EVENTS", 2)  # below a pass's 3 units
    batches = chain_batches(3)
    reference = make_chain()
    offloaded = copy.deepcopy(reference)
    expected = chain_train(reference, batches)
    manager = OffloadTrainingManager(offloaded, "cpu", prefetch_depth=1)
    assert torch.equal(expected, chain_train(offloaded, batches, manager))
    assert manager.execution_order() == [] and manager.prefetch_stats.hits == 0
    with torch.no_grad():  # passes delimited by the root forward alone overflow, and end, the same way
        for x in batches:
            assert torch.equal(reference(x), offloaded(x))
    assert manager.prefetch_stats.passes == 2 * len(batches) - 1 and manager.prefetch_stats.hits == 0


def test_prefetch_is_off_by_default_on_the_cpu_and_zero_changes_nothing():
    model = make_chain()
    manager = OffloadTrainingManager(model, "cpu")
    assert manager.config.prefetch_depth == 0
    assert manager.prefetch_stats is None and manager.execution_order() == []


@pytest.mark.parametrize("depth", [-1, True, 1.5, "1"])
def test_prefetch_depth_must_be_a_whole_number(depth):
    with pytest.raises(ValueError, match="prefetch_depth="):
        OffloadTrainingManager(make_chain(), "cpu", prefetch_depth=depth)


# ---- on a CUDA device (skipped without one) ---------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
@pytest.mark.parametrize("mode", MODES)
def test_training_on_cuda_with_prefetch_matches_plain_cuda_training(mode, checkpointing, depth):
    batches = [(ids.cuda(), targets.cuda()) for ids, targets in make_batches(4)]
    reference = make_model(use_gradient_checkpointing=checkpointing)
    offloaded = copy.deepcopy(reference)
    expected = train(reference.cuda(), batches)
    manager = OffloadTrainingManager(offloaded, "cuda", prefetch_depth=depth, **mode)
    losses = train(offloaded, batches, manager)
    assert manager.prefetch_stats.hits > 0 and manager.prefetch_stats.order_changes == 0
    manager.remove()
    torch.testing.assert_close(losses, expected, rtol=0, atol=1e-6)
    for name, tensor in state(reference).items():
        torch.testing.assert_close(state(offloaded.cuda())[name], tensor, rtol=0, atol=1e-6)


def wide_chain(num_layers=8, width=2048):
    torch.manual_seed(0)
    layers = nn.Sequential(*[nn.Linear(width, width) for _ in range(num_layers)]).requires_grad_(False)
    layers[-1].requires_grad_(True)
    return layers


@pytest.mark.gpu
def test_cuda_prefetch_copies_on_the_copy_stream_and_is_on_by_default(monkeypatch):
    from diffsynth.core.offload_training import DirectEngine, transfer

    streams = []
    original = transfer.copy_bytes

    def copy_bytes(dst, src, non_blocking=False):
        streams.append(torch.cuda.current_stream())
        original(dst, src, non_blocking)

    monkeypatch.setattr(transfer, "copy_bytes", copy_bytes)
    reference = wide_chain()
    offloaded = copy.deepcopy(reference)
    batches = [torch.randn(64, 2048, device="cuda", requires_grad=True) for _ in range(4)]
    expected = [layers_step(reference.cuda(), x) for x in batches]
    manager = OffloadTrainingManager(offloaded, "cuda")
    assert manager.config.prefetch_depth == 1 and isinstance(manager._prefetch.engine, DirectEngine)
    losses = [layers_step(offloaded, x, manager) for x in batches]
    copy_stream = manager._prefetch.engine._stream
    assert streams and all(stream == copy_stream for stream in streams)
    assert copy_stream != torch.cuda.default_stream()
    assert manager.prefetch_stats.hits > 0
    torch.testing.assert_close(torch.stack(losses), torch.stack(expected), rtol=0, atol=1e-6)


def layers_step(model, x, manager=None):
    loss = model(x).square().mean()
    loss.backward()
    if manager is not None:
        manager.after_backward()
    return loss.detach()


@pytest.mark.gpu
def test_cuda_steps_after_the_first_allocate_no_device_memory_for_weights():
    model = wide_chain()
    manager = OffloadTrainingManager(model, "cuda", prefetch_depth=2)
    x = torch.randn(64, 2048, device="cuda", requires_grad=True)
    for _ in range(3):
        layers_step(model, x, manager)
    torch.cuda.synchronize()
    segments = torch.cuda.memory_stats()["segment.all.allocated"]
    pool_allocations = manager.device_pool_stats.allocations
    large_allocations = torch.cuda.memory_stats()["allocation.large_pool.allocated"]
    for _ in range(3):
        layers_step(model, x, manager)
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["segment.all.allocated"] == segments, "new device memory was allocated"
    assert manager.device_pool_stats.allocations == pool_allocations
    # Each step loads 7 frozen 16 MiB weights twice; with the pool none of them goes through the allocator.
    per_step = (torch.cuda.memory_stats()["allocation.large_pool.allocated"] - large_allocations) / 3
    assert per_step < 7, per_step


@pytest.mark.gpu
def test_cuda_optimizer_offload_keeps_masters_and_gradient_staging_pinned():
    model = wide_chain(num_layers=3)
    model.requires_grad_(True)
    manager = OffloadTrainingManager(model, "cuda", enable_optimizer_cpu_offload=True, prefetch_depth=1)
    x = torch.randn(64, 2048, device="cuda", requires_grad=True)
    for _ in range(3):
        layers_step(model, x, manager)
    trainable = [o for o in manager._offloaders.values() if isinstance(o, TrainableParamOffloader)]
    assert len(trainable) == 6
    assert all(o.master.is_pinned() and o._grad_staging.is_pinned() for o in trainable)
    assert all(p.grad is not None and p.grad.device.type == "cpu" for p in model.parameters())
