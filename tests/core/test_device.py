import pytest
import torch

from diffsynth.core.device import copy_to_device, peak_memory_bytes, resolve_device


def test_resolve_device_accepts_cpu_and_names_the_argument_on_error():
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="target_device='npu0'"):
        resolve_device("npu0", "target_device")


def test_copy_to_device_always_copies():
    source = torch.arange(4.0)
    copy = copy_to_device(source, torch.device("cpu"))
    assert torch.equal(copy, source) and copy.data_ptr() != source.data_ptr()


def test_cpu_has_no_peak_memory_statistics():
    assert peak_memory_bytes(torch.device("cpu")) is None
