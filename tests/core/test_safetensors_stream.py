import pytest
import safetensors.torch
import torch

from diffsynth.core.safetensors_stream import SafetensorsStream

# Every dtype the installed safetensors reads (its own table), each a tensor whose bytes are not all alike.
LOADABLE = sorted(set(safetensors.torch._TYPES.values()), key=str)


def sample(dtype: torch.dtype, shape=(3, 5)) -> torch.Tensor:
    """A tensor of ``shape`` whose bytes differ (any bit pattern: a float may be NaN; a bool is 0 or 1)."""
    count = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    raw = (torch.arange(1, 1 + count) * 37 % 251).to(torch.uint8)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8)


@pytest.mark.parametrize("dtype", LOADABLE, ids=str)
def test_every_dtype_safetensors_reads_is_written_and_reads_back_bit_for_bit(tmp_path, dtype):
    tensors = {"a": sample(dtype), "empty": torch.empty((0, 4), dtype=dtype), "scalar": sample(dtype, ())}
    path = tmp_path / "file.safetensors"
    stream = SafetensorsStream(path, [(name, tensor.shape, tensor.dtype) for name, tensor in tensors.items()])
    for name, tensor in tensors.items():
        stream.write(name, tensor)
    stream.close()
    loaded = safetensors.torch.load_file(path)
    assert set(loaded) == set(tensors)
    for name, tensor in tensors.items():
        assert loaded[name].dtype == dtype and loaded[name].shape == tensor.shape
        assert torch.equal(as_bytes(loaded[name]), as_bytes(tensor)), name


def test_a_dtype_safetensors_cannot_store_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"'q'.*torch.quint8.*cannot store"):
        SafetensorsStream(tmp_path / "file.safetensors", [("q", (2,), torch.quint8)])
