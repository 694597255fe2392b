import pytest
import torch

from diffsynth.core.device import (allocate_host_bytes, copy_into, copy_to_device, peak_memory_bytes, resolve_device,
                                   synchronize)


def test_resolve_device_accepts_cpu_and_names_the_argument_on_error():
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="target_device='npu0'"):
        resolve_device("npu0", "target_device")


def test_resolve_device_drops_a_cpu_index():
    """accelerate gives each of several CPU processes ``cpu:0``; CPU tensors report a bare ``cpu``."""
    assert resolve_device("cpu:0") == resolve_device(torch.device("cpu", 0)) == torch.empty(1).device


def test_copy_to_device_always_copies():
    source = torch.arange(4.0)
    copy = copy_to_device(source, torch.device("cpu"))
    assert torch.equal(copy, source) and copy.data_ptr() != source.data_ptr()


def test_copy_into_fills_and_returns_the_destination():
    destination = torch.zeros(4, dtype=torch.bfloat16)
    assert copy_into(destination, torch.arange(4.0)) is destination
    assert torch.equal(destination, torch.arange(4.0, dtype=torch.bfloat16))


@pytest.mark.gpu
def test_copy_into_crosses_between_pinned_host_memory_and_the_gpu_both_ways():
    device = torch.device("cuda")
    host = allocate_host_bytes(16).view(torch.float32)
    on_gpu = copy_into(torch.empty(4, device=device), torch.arange(4.0).pin_memory())
    copy_into(host, on_gpu * 2)
    synchronize(device)
    assert host.is_pinned() and torch.equal(host, torch.arange(4.0) * 2)


def test_cpu_has_no_peak_memory_statistics():
    assert peak_memory_bytes(torch.device("cpu")) is None
