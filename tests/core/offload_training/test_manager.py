import copy

import pytest
import torch
from torch import nn

from diffsynth.core import OffloadTrainingManager
from diffsynth.core.offload_training import StaticParamOffloader, TrainableParamOffloader

from .models import make_batches, make_model

MODES = [
    pytest.param(dict(enable_optimizer_cpu_offload=False), id="frozen-offload"),
    pytest.param(dict(enable_optimizer_cpu_offload=True), id="optimizer-offload"),
    pytest.param(dict(enable_optimizer_cpu_offload=False, cpu_offload_split_threshold=0.001), id="threshold-blocks"),
    pytest.param(dict(enable_optimizer_cpu_offload=True, cpu_offload_split_threshold=1.0), id="threshold-whole"),
]


def train(model, batches, manager=None, accumulation=1):
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for step, (ids, targets) in enumerate(batches):
        loss = torch.nn.functional.cross_entropy(model(ids), targets) / accumulation
        loss.backward()
        if manager is not None:
            manager.after_backward()
        losses.append(loss.detach())
        if (step + 1) % accumulation == 0:
            optimizer.step()
            optimizer.zero_grad()
    return torch.stack(losses)


def state(model):
    """Every parameter and buffer by name, read through the tensors the model would compute with."""
    return {name: t.detach().clone() for name, t in [*model.named_parameters(), *model.named_buffers()]}


def assert_same(expected, actual):
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("accumulation", [1, 2])
def test_training_matches_plain_training_bitwise(mode, checkpointing, accumulation):
    batches = make_batches(4)
    reference = make_model(use_gradient_checkpointing=checkpointing)
    offloaded = copy.deepcopy(reference)
    expected_losses = train(reference, batches, accumulation=accumulation)

    manager = OffloadTrainingManager(offloaded, "cpu", **mode)
    losses = train(offloaded, batches, manager, accumulation=accumulation)
    manager.remove()

    assert torch.equal(expected_losses, losses)
    assert_same(state(reference), state(offloaded))
    assert offloaded.head.weight is offloaded.embed.weight


def test_frozen_weights_are_placeholders_between_uses_and_never_copied_back():
    model = make_model()
    manager = OffloadTrainingManager(model, "cpu")
    static = [o for o in manager._offloaders.values() if isinstance(o, StaticParamOffloader)]
    assert static and all(o.param.numel() == 0 for o in static)
    masters = {id(o): o.master.clone() for o in static}
    ids, targets = make_batches(1)[0]
    torch.nn.functional.cross_entropy(model(ids), targets).backward()
    manager.after_backward()
    assert all(o.param.numel() == 0 for o in static)
    assert all(torch.equal(masters[id(o)], o.master) for o in static)
    assert manager.resident_bytes == 0


def test_optimizer_offload_leaves_gradients_on_the_host_after_backward():
    model = make_model()
    manager = OffloadTrainingManager(model, "cpu", enable_optimizer_cpu_offload=True)
    ids, targets = make_batches(1)[0]
    torch.nn.functional.cross_entropy(model(ids), targets).backward()
    manager.after_backward()
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and all(p.grad is not None and p.grad.device.type == "cpu" for p in trainable)


def test_optimizer_offload_masters_and_gradient_staging_live_in_the_planned_host_arena():
    model = make_model()
    manager = OffloadTrainingManager(model, "cpu", enable_optimizer_cpu_offload=True)
    chunks_planned = len(manager.pool.chunks)
    trainable = [o for o in manager._offloaders.values() if isinstance(o, TrainableParamOffloader)]
    train(model, make_batches(2), manager)
    arena = {chunk.view(0, 1).untyped_storage().data_ptr() for chunk in manager.pool.chunks}
    assert trainable and all(o.master.untyped_storage().data_ptr() in arena for o in trainable)
    assert all(o._grad_staging.untyped_storage().data_ptr() in arena for o in trainable)
    assert len(manager.pool.chunks) == chunks_planned and manager.pool.fallback_bytes == 0


def test_optimizer_offload_accumulates_gradients_of_backwards_between_two_after_backward_calls():
    reference = make_model()
    offloaded = copy.deepcopy(reference)
    manager = OffloadTrainingManager(offloaded, "cpu", enable_optimizer_cpu_offload=True)
    for model in (reference, offloaded):
        for ids, targets in make_batches(2):
            torch.nn.functional.cross_entropy(model(ids), targets).backward()
    manager.after_backward()
    for (name, expected), param in zip(reference.named_parameters(), offloaded.parameters()):
        if expected.requires_grad:
            assert torch.equal(param.grad, expected.grad), name


class Codec(nn.Module):
    """A root with encode and decode (so it is always split) holding a trainable tensor directly: a resident one."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 4))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.scale

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(x))


def test_optimizer_offload_trains_tensors_the_root_module_holds_directly():
    torch.manual_seed(0)
    reference = Codec()
    offloaded = copy.deepcopy(reference)
    manager = OffloadTrainingManager(offloaded, "cpu", enable_optimizer_cpu_offload=True)
    batches = [torch.randn(3, 4, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    for model, step_manager in ((reference, None), (offloaded, manager)):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in batches:
            model(x).square().mean().backward()
            if step_manager is not None:
                step_manager.after_backward()
            optimizer.step()
            optimizer.zero_grad()
    manager.remove()
    assert not torch.equal(offloaded.scale, torch.linspace(0.5, 1.5, 4))
    assert_same(state(reference), state(offloaded))


def test_batchnorm_running_statistics_survive_offload():
    reference = make_model()
    offloaded = copy.deepcopy(reference)
    manager = OffloadTrainingManager(offloaded, "cpu")
    for model in (reference, offloaded):
        ids, _ = make_batches(1)[0]
        model(ids)
    manager.remove()
    for block_ref, block in zip(reference.blocks, offloaded.blocks):
        assert not torch.equal(block_ref.bn.running_mean, torch.zeros_like(block_ref.bn.running_mean))
        assert torch.equal(block_ref.bn.running_mean, block.bn.running_mean)
        assert torch.equal(block_ref.bn.num_batches_tracked, block.bn.num_batches_tracked)


def test_remove_gives_back_a_model_that_trains_like_one_never_offloaded():
    batches = make_batches(3)
    reference = make_model()
    offloaded = copy.deepcopy(reference)
    train(reference, batches[:1])
    manager = OffloadTrainingManager(offloaded, "cpu", enable_optimizer_cpu_offload=True)
    train(offloaded, batches[:1], manager)
    manager.remove()

    assert not offloaded._forward_pre_hooks and not offloaded._forward_hooks
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in offloaded.modules())
    assert all(p.grad is None for p in offloaded.parameters())
    for tensor in [*offloaded.parameters(), *offloaded.buffers()]:
        assert tensor.numel() > 0 and tensor.device.type == "cpu"
    assert torch.equal(train(reference, batches[1:]), train(offloaded, batches[1:]))
    assert_same(state(reference), state(offloaded))


def test_inference_under_no_grad_matches_and_leaves_nothing_loaded():
    reference = make_model().eval()
    offloaded = copy.deepcopy(reference)
    manager = OffloadTrainingManager(offloaded, "cpu", cpu_offload_split_threshold=0.001)
    ids, _ = make_batches(1)[0]
    with torch.no_grad():
        assert torch.equal(reference(ids), offloaded(ids))
    assert manager.resident_bytes == 0 and manager.live_device_copy_bytes() == 0


class TestBadInput:
    def test_optimizer_offload_without_trainable_parameters(self):
        model = make_model().requires_grad_(False)
        with pytest.raises(ValueError, match="no trainable parameter.*enable_optimizer_cpu_offload"):
            OffloadTrainingManager(model, "cpu", enable_optimizer_cpu_offload=True)

    @pytest.mark.parametrize("threshold", [-1, 0, True])
    def test_threshold_must_be_a_positive_size(self, threshold):
        with pytest.raises(ValueError, match="cpu_offload_split_threshold"):
            OffloadTrainingManager(make_model(), "cpu", cpu_offload_split_threshold=threshold)

    @pytest.mark.parametrize("device", ["gpu", "cuda:x", "tpu"])
    def test_unknown_device(self, device):
        with pytest.raises(ValueError, match=f"target_device={device!r}"):
            OffloadTrainingManager(make_model(), device)

    @pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
    def test_cuda_without_cuda(self):
        with pytest.raises(ValueError, match="CUDA is not available.*'cpu'"):
            OffloadTrainingManager(make_model(), "cuda")

    def test_after_backward_before_any_backward_is_a_no_op(self):
        model = make_model()
        manager = OffloadTrainingManager(model, "cpu", enable_optimizer_cpu_offload=True)
        before = state(model)
        manager.after_backward()
        manager.after_backward()
        assert_same(before, state(model))
        assert manager.resident_bytes == 0

    def test_bad_input_leaves_the_model_untouched(self):
        model = make_model().requires_grad_(False)
        before = state(model)
        with pytest.raises(ValueError):
            OffloadTrainingManager(model, "cpu", enable_optimizer_cpu_offload=True)
        assert_same(before, state(model))
