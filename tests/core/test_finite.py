"""The finite-values check shared by every writer (and reader) of weight files."""

import pytest
import torch

from diffsynth.core.finite import NonFiniteTensorError, is_finite, nonfinite_names, require_finite


def test_finite_tensors_of_every_dtype_pass():
    tensors = {"fp32": torch.randn(4), "bf16": torch.randn(4).bfloat16(), "ints": torch.arange(4),
               "flags": torch.ones(2, dtype=torch.bool), "fp8": torch.randn(4).to(torch.float8_e4m3fn),
               "huge": torch.full((2,), torch.finfo(torch.float32).max)}
    require_finite(tensors, "the weights")
    assert nonfinite_names(tensors) == []


def test_nan_and_inf_are_found_in_any_float_dtype():
    assert not is_finite(torch.tensor([1.0, float("nan")]))
    assert not is_finite(torch.tensor([float("-inf")]).half())
    assert not is_finite(torch.tensor([1.0, float("nan")]).to(torch.float8_e4m3fn))  # no isfinite kernel for it


def test_the_error_names_the_bad_tensors_and_counts_them():
    tensors = {f"layer{i}": torch.zeros(3) for i in range(8)}
    for i in range(1, 8):
        tensors[f"layer{i}"][1] = float("nan") if i % 2 else float("inf")
    with pytest.raises(NonFiniteTensorError) as error:
        require_finite(tensors, "not writing out/step-3.safetensors")
    message = str(error.value)
    assert message.startswith("not writing out/step-3.safetensors: NaN or inf values in 7 of 8 tensors (layer1, ")
    assert "and 2 more" in message and "layer0" not in message
    assert error.value.names == [f"layer{i}" for i in range(1, 8)]
