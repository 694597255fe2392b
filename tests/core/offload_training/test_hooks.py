"""The residency driver on its own: the moments it reports to a policy, in order, for plain and checkpointed chains."""

import gc

import pytest
import torch
from torch import nn

from diffsynth.core import gradient_checkpoint_forward
from diffsynth.core.offload_training import ResidencyDriver, ResidencyPolicy


class Recorder(ResidencyPolicy):
    """A policy that moves nothing and writes down every moment (a new policy needs no hook code)."""

    wants_backward_start = True

    def __init__(self) -> None:
        self.events = []

    def on_pass_start(self):
        self.events.append(("pass",))

    def before_forward(self, unit, needs_backward, checkpointed):
        self.events.append(("forward", unit, needs_backward, checkpointed))

    def after_forward(self, unit, needs_backward, bounded):
        self.events.append(("forwarded", unit, needs_backward, bounded))

    def before_recompute(self, unit):
        self.events.append(("recompute", unit))

    def on_backward_start(self, unit):
        self.events.append(("backward", unit))

    def on_backward_done(self, unit):
        self.events.append(("done", unit))


class Chain(nn.Module):
    def __init__(self, checkpointing=False, reentrant=False):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
        self.checkpointing, self.reentrant = checkpointing, reentrant

    def forward(self, x):
        for layer in self.layers:
            if self.reentrant:
                x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=True)
            else:
                x = gradient_checkpoint_forward(layer, self.checkpointing, False, x)
        return x


def run(model, x):
    policy = Recorder()
    driver = ResidencyDriver(list(model.layers), policy, root=model)
    model(x).sum().backward()
    driver.remove()
    return policy.events


def test_a_plain_pass_reports_forward_then_backward_start_and_done_per_unit():
    events = run(Chain(), torch.randn(2, 4, requires_grad=True))
    forward = [("pass",)] + [e for i in range(3) for e in (("forward", i, True, False), ("forwarded", i, True, True))]
    backward = [e for i in reversed(range(3)) for e in (("backward", i), ("done", i))]
    assert events == forward + backward


def test_checkpointing_adds_a_recompute_between_backward_start_and_done():
    events = run(Chain(checkpointing=True), torch.randn(2, 4, requires_grad=True))
    assert events[1:3] == [("forward", 0, True, True), ("forwarded", 0, True, True)]
    backward = [e for e in events if e[0] in ("backward", "recompute", "done")]
    assert backward == [e for i in reversed(range(3)) for e in (("backward", i), ("recompute", i), ("done", i))]


def test_reentrant_checkpointing_brackets_the_recompute_instead_of_the_gradless_forward():
    events = run(Chain(reentrant=True), torch.randn(2, 4, requires_grad=True))
    assert ("forwarded", 0, False, False) in events  # the forward ran without grad: no boundary
    assert [e for e in events if e[0] in ("recompute", "done")] == [
        e for i in reversed(range(3)) for e in (("recompute", i), ("done", i))]


def test_inputs_without_gradient_leave_the_first_unit_unbounded_and_without_root_unit_zero_starts_the_pass():
    model = Chain()
    policy = Recorder()
    ResidencyDriver(list(model.layers), policy)
    model(torch.randn(2, 4)).sum().backward()
    assert policy.events[:3] == [("pass",), ("forward", 0, True, False), ("forwarded", 0, True, False)]
    assert ("done", 0) not in policy.events and ("done", 1) in policy.events


def test_a_dropped_graph_releases_its_pending_backwards_and_a_reset_forgets_them():
    model = Chain()
    driver = ResidencyDriver(list(model.layers), Recorder(), root=model)
    x = torch.randn(2, 4, requires_grad=True)
    output = model(x)
    assert driver.pending == [1, 1, 1]
    del output
    gc.collect()
    assert driver.pending == [0, 0, 0]
    output = model(x)
    driver.reset()
    assert driver.pending == [0, 0, 0]
    seen = len(driver.policy.events)
    output.sum().backward()  # a graph from before the reset reports no end of backward and counts nothing
    after = driver.policy.events[seen:]
    assert driver.pending == [0, 0, 0] and after and not [e for e in after if e[0] == "done"]


@pytest.mark.parametrize("grad", [False, True])
def test_saved_tensor_hooks_replace_what_autograd_saves_while_the_root_runs(grad):
    model = Chain()
    packed = []

    def pack(tensor):
        packed.append(tensor.shape)
        return ("mine", tensor) if tensor.shape == (4, 4) else None

    ResidencyDriver(list(model.layers), Recorder(), root=model,
                    saved_tensor_hooks=(pack, lambda replacement: replacement[1]))
    with torch.set_grad_enabled(grad):
        expected = Chain()(torch.ones(2, 4))
        output = model(torch.ones(2, 4).requires_grad_(grad))
    torch.testing.assert_close(output, expected)
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None  # popped again
    assert bool(packed) == grad
    if grad:
        output.sum().backward()
        assert all(layer.weight.grad is not None for layer in model.layers)
