"""What is on the device when: the accounting, and the invariant that only the computing unit is loaded."""

import pytest
import torch

from diffsynth.core import OffloadTrainingManager
from diffsynth.core.offload_training import OffloadUnit, StaticParamOffloader

from .models import DIM, make_batches, make_model


def encloses(outer: str, inner: str) -> bool:
    return outer == "" or inner == outer or inner.startswith(outer + ".")


def record_loads(monkeypatch, manager):
    """After every unit load: the loaded units, and the live bytes of device copies."""
    snapshots = []
    original_load = OffloadUnit.load

    def load(unit):
        original_load(unit)
        loaded = [u for u in manager.units if u.is_loaded]
        snapshots.append((unit, loaded, manager.live_device_copy_bytes()))
        for other in manager.units:
            if not other.is_loaded:
                for offloader in other.offloaders:
                    if isinstance(offloader, StaticParamOffloader) and not offloader.is_loaded:
                        assert offloader.param.numel() == 0, f"{other.name} holds more than its placeholder"

    monkeypatch.setattr(OffloadUnit, "load", load)
    return snapshots


def one_step(model, manager, live_after_forward=None):
    ids, targets = make_batches(1)[0]
    extra = torch.randn(len(ids), DIM, requires_grad=True)
    loss = torch.nn.functional.cross_entropy(model(ids, extra), targets)
    if live_after_forward is not None:
        live_after_forward.append(manager.live_device_copy_bytes())
    loss.backward()
    manager.after_backward()


def chain_bytes(manager, unit):
    return sum(u.offloaded_nbytes for u in manager.units if encloses(u.name, unit.name))


@pytest.mark.parametrize("optimizer_offload", [False, True])
def test_only_the_computing_unit_and_its_enclosing_holders_are_loaded(monkeypatch, optimizer_offload):
    model = make_model()
    manager = OffloadTrainingManager(model, "cpu", enable_optimizer_cpu_offload=optimizer_offload)
    snapshots = record_loads(monkeypatch, manager)
    live_after_forward = []
    one_step(model, manager, live_after_forward)

    # blocks.1.linear trains: on the host with optimizer offload, else on the device for good, and then no unit.
    assert {u.name for u, _, _ in snapshots} >= {"embed", "head", "blocks.2.bn", ""}
    assert ("blocks.1.linear" in {u.name for u, _, _ in snapshots}) == optimizer_offload
    for unit, loaded, _ in snapshots:
        strays = [u.name for u in loaded if not (encloses(u.name, unit.name) or encloses(unit.name, u.name))]
        assert not strays, f"while {unit.name!r} loads, {strays} are loaded too"
    bound = max(chain_bytes(manager, u) for u in manager.units)
    assert 0 < manager.peak_resident_bytes <= bound
    # Autograd keeps no device copy of any weight between forward and backward (saved weights are references).
    assert live_after_forward == [0]
    assert max(live for _, _, live in snapshots) <= bound
    assert manager.resident_bytes == 0 and manager.live_device_copy_bytes() == 0


def test_gradient_checkpointing_holds_one_block_between_recompute_and_backward(monkeypatch):
    model = make_model(use_gradient_checkpointing=True)
    manager = OffloadTrainingManager(model, "cpu")
    snapshots = record_loads(monkeypatch, manager)
    one_step(model, manager)

    recomputed = {u.name for u, _, _ in snapshots if u.name.startswith("blocks.")}
    assert recomputed
    for _, loaded, _ in snapshots:
        blocks = {u.name.split(".")[1] for u in loaded if u.name.startswith("blocks.")}
        assert len(blocks) <= 1, f"units of blocks {blocks} loaded at once"
    block_bytes = max(sum(u.offloaded_nbytes for u in manager.units if encloses(f"blocks.{i}", u.name))
                      for i in range(len(model.blocks)))
    root_bytes = sum(u.offloaded_nbytes for u in manager.units if u.name == "")
    largest_unit = max(chain_bytes(manager, u) for u in manager.units)
    assert manager.peak_resident_bytes <= max(block_bytes + root_bytes, largest_unit)


def test_threshold_units_are_whole_modules_and_fully_loaded_while_they_compute(monkeypatch):
    model = make_model()
    threshold_mb = 1.1 * sum(t.numel() * t.element_size() for t in model.blocks[0].state_dict().values()) / 2**20
    manager = OffloadTrainingManager(model, "cpu", cpu_offload_split_threshold=threshold_mb)
    assert {u.name for u in manager.units} == {"", "embed", "blocks.0", "blocks.1", "blocks.2", "head"}
    seen = []

    def check_whole(module, *args):
        for name, param in module.named_parameters():
            assert param.numel() > 0, name
        seen.append(module)

    for block in model.blocks:
        block.bn.register_forward_hook(check_whole)
        block.linear.register_forward_pre_hook(check_whole)
    one_step(model, manager)
    assert len(seen) == 2 * len(model.blocks)


def test_peak_can_be_reset():
    model = make_model()
    manager = OffloadTrainingManager(model, "cpu")
    one_step(model, manager)
    assert manager.peak_resident_bytes > 0
    manager.reset_peak_resident_bytes()
    assert manager.peak_resident_bytes == manager.resident_bytes == 0
