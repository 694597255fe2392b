"""The offload manager's per-unit bookkeeping, counted (not timed): what one step does per unit once warm.

``scripts/bench_unit_overhead.py`` measures the time; these tests pin the behaviour that keeps it low: one pool
take and give-back per tensor load, no tensor view made per load, no generator scan of flat tensor arguments, no hook
on units that move nothing, and a unit released as soon as its backward is done.
"""

import copy

import torch
from peft import LoraConfig, inject_adapter_in_model
from torch import nn

from diffsynth.core import OffloadTrainingManager
from diffsynth.core.offload_training import DeviceBufferPool, hooks

WIDTH = 8


class Chain(nn.Module):
    """Frozen ``Linear`` and ``LayerNorm`` leaves after a trainable scale, so every leaf has a backward."""

    def __init__(self, leaves: int = 6) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, WIDTH))
        self.layers = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) if i % 2 == 0 else nn.LayerNorm(WIDTH)
                                      for i in range(leaves)])
        self.layers.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x * self.scale)


def step(model, manager=None, seed=0):
    x = torch.randn(3, WIDTH, generator=torch.Generator().manual_seed(seed))
    loss = model(x).square().mean()
    loss.backward()
    if manager is not None:
        manager.after_backward()
    return loss.detach()


class Counter:
    def __init__(self, monkeypatch, owner, name):
        self.calls = 0
        original = getattr(owner, name)

        def counted(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)


def test_a_warm_step_takes_and_gives_back_one_buffer_per_tensor_load_and_makes_no_view(monkeypatch):
    model = Chain()
    manager = OffloadTrainingManager(model, "cpu")
    for seed in range(2):
        step(model, manager, seed)
    moved = [o for unit in manager.units for o in unit.offloaders if o.counts_toward_residency]
    loads_before = sum(o.load_count for o in moved)
    takes = Counter(monkeypatch, DeviceBufferPool, "take")
    gives = Counter(monkeypatch, DeviceBufferPool, "give_back")
    views = Counter(monkeypatch, torch.Tensor, "view")
    scans = Counter(monkeypatch, hooks, "iter_tensors")
    step(model, manager, seed=2)
    loads = sum(o.load_count for o in moved) - loads_before
    assert loads == 2 * len(moved)  # each tensor once for its forward, once for its backward
    assert takes.calls == gives.calls == loads
    assert views.calls == 0  # the pool lends the views it made on the first loads
    assert scans.calls == 0  # tensor inputs and outputs are checked directly, not through a generator
    assert manager.device_pool_stats.escapes == 0 and manager.resident_bytes == 0


def test_every_unit_is_released_once_its_backward_is_done():
    model = Chain()
    manager = OffloadTrainingManager(model, "cpu")
    held_at_the_end = []
    x = torch.randn(3, WIDTH, requires_grad=True)
    # The hook of the input's gradient runs after every unit's backward, before after_backward().
    x.register_hook(lambda grad: held_at_the_end.append(manager.resident_bytes))
    model(x).square().mean().backward()
    assert held_at_the_end == [0]
    manager.after_backward()


class SometimesIdentity(nn.Module):
    """A module with weights that returns its input unchanged (a disabled norm): its output is the driver's view of
    its input, so its backward is nothing, and its weights must not be loaded for it."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(WIDTH), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_a_unit_that_returns_its_input_is_not_loaded_for_its_empty_backward():
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(WIDTH, WIDTH), SometimesIdentity(), nn.Linear(WIDTH, WIDTH))
    reference.requires_grad_(False)
    reference[2].bias.requires_grad_(True)
    offloaded = copy.deepcopy(reference)
    manager = OffloadTrainingManager(offloaded, "cpu")
    identity = manager._offloaders[id(offloaded[1].weight)]
    x = torch.randn(3, WIDTH, requires_grad=True)
    step_losses = []
    for model in (reference, offloaded):
        step_losses.append(model(x).square().mean())
        step_losses[-1].backward()
    assert identity.load_count == 1  # its forward only
    assert manager.resident_bytes == 0
    manager.after_backward()
    torch.testing.assert_close(offloaded[2].bias.grad, reference[2].bias.grad, rtol=0, atol=0)


def test_layers_that_stay_on_the_device_are_not_units_and_training_matches_plain():
    torch.manual_seed(0)
    reference = Chain()
    reference.scale.requires_grad_(False)
    inject_adapter_in_model(LoraConfig(r=2, lora_alpha=2, target_modules=["0", "2", "4"]), reference.layers)
    offloaded = copy.deepcopy(reference)
    manager = OffloadTrainingManager(offloaded, "cpu")
    names = [unit.name for unit in manager.units]
    assert names and not any("lora_" in name for name in names)
    assert all(any(o.counts_toward_residency for o in unit.offloaders) for unit in manager.units)
    trainable = [name for name, p in offloaded.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    for seed in range(3):
        expected, actual = step(reference, seed=seed), step(offloaded, manager, seed=seed)
        assert torch.equal(expected, actual)
        for (name, p), q in zip(reference.named_parameters(), offloaded.parameters()):
            if p.requires_grad:
                assert torch.equal(p.grad, q.grad), name
        reference.zero_grad()
        offloaded.zero_grad()
