"""fp8 storage of frozen convolution weights: the layer keeps its class's code, reads as its dtype, stores fp8."""

import pytest
import torch
from diffusers.models.autoencoders.autoencoder_kl_qwenimage import QwenImageCausalConv3d
from safetensors.torch import load_file, save_file
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionPatchEmbed

from diffsynth.core.fp8_conv import enable_fp8_conv_storage, is_fp8_conv

FP8 = torch.float8_e4m3fn


def relative_error(actual, expected):
    return ((actual.float() - expected.float()).norm() / expected.float().norm()).item()


class Encoder(torch.nn.Module):
    """A causal conv (diffusers' VAE layer: pads in time, then calls Conv3d) first, so it owns the first parameter."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        torch.manual_seed(0)
        self.conv_in = QwenImageCausalConv3d(3, 16, 3, padding=1).to(dtype)
        self.norm = torch.nn.GroupNorm(4, 16).to(dtype)
        self.conv_out = torch.nn.Conv2d(16, 8, 1).to(dtype)
        self.requires_grad_(False)

    @property
    def dtype(self):
        return next(self.parameters()).dtype  # as diffusers' ModelMixin reads it

    def forward(self, x):
        hidden = self.norm(self.conv_in(x.to(self.dtype)))
        return self.conv_out(hidden[:, :, 0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_converted_convolutions_keep_their_code_and_compute_in_the_model_dtype(dtype):
    model = Encoder(dtype)
    x = torch.randn(1, 3, 2, 16, 16)
    expected = model(x)
    storage = enable_fp8_conv_storage(model)
    assert storage.layer_names == ["conv_in", "conv_out"] and storage.kind == "convolution"
    assert isinstance(model.conv_in, QwenImageCausalConv3d) and is_fp8_conv(model.conv_in)
    assert model.conv_in._parameters["weight"].dtype == FP8 and model.conv_in.weight.dtype == dtype
    assert model.dtype == dtype  # the scale, not the fp8 weight, is the first parameter
    actual = model(x)
    assert actual.dtype == dtype and 0 < relative_error(actual, expected) < 0.05
    assert storage.bytes_after < storage.bytes_before * (0.3 if dtype == torch.float32 else 0.55)


def test_code_that_casts_its_input_to_the_weight_dtype_still_works():
    embed = Qwen2_5_VisionPatchEmbed(patch_size=2, temporal_patch_size=2, in_channels=3, embed_dim=8)
    embed = embed.to(torch.bfloat16).requires_grad_(False)
    pixels = torch.randn(4, 3 * 2 * 2 * 2)
    expected = embed(pixels)
    enable_fp8_conv_storage(embed)
    assert relative_error(embed(pixels), expected) < 0.05


def test_state_dict_round_trip_and_full_precision_loading(tmp_path):
    model = Encoder()
    full = {key: value.clone() for key, value in model.state_dict().items()}
    enable_fp8_conv_storage(model)
    state = model.state_dict()
    assert state["conv_in.weight"].dtype == FP8 and state["conv_in.weight_scale"].shape == (16, 1, 1, 1, 1)
    save_file(state, str(tmp_path / "fp8.safetensors"))
    fresh = Encoder()
    enable_fp8_conv_storage(fresh)
    fresh.load_state_dict(load_file(str(tmp_path / "fp8.safetensors")))
    assert torch.equal(fresh.conv_in.weight, model.conv_in.weight)
    fresh.load_state_dict(full)  # a full-precision checkpoint is quantized on the way in
    assert fresh.conv_in._parameters["weight"].dtype == FP8
    assert relative_error(fresh.conv_in.weight, full["conv_in.weight"]) < 0.05


def test_a_dtype_cast_moves_the_fp8_weight_without_casting_it():
    model = Encoder()
    enable_fp8_conv_storage(model)
    model.to(torch.bfloat16)
    assert model.conv_in._parameters["weight"].dtype == FP8 and model.conv_in.weight.dtype == torch.bfloat16


def test_remove_restores_plain_convolutions():
    model = Encoder()
    storage = enable_fp8_conv_storage(model)
    quantized = model.conv_in.weight.clone()
    assert storage.remove() == 2
    assert type(model.conv_in) is QwenImageCausalConv3d and not is_fp8_conv(model.conv_out)
    assert model.conv_in.weight.dtype == torch.float32 and torch.equal(model.conv_in.weight, quantized)


def test_exclusions_and_refusals():
    model = Encoder()
    storage = enable_fp8_conv_storage(model, exclude=["conv_out"])
    assert storage.layer_names == ["conv_in"] and not is_fp8_conv(model.conv_out)
    with pytest.raises(ValueError, match="no convolution layer left to convert"):
        enable_fp8_conv_storage(model, exclude=["conv_out"])
    with pytest.raises(ValueError, match=r"exclude entries \['conv_mid'\] match no convolution"):
        enable_fp8_conv_storage(Encoder(), exclude=["conv_mid"])
    trainable = Encoder()
    trainable.conv_out.requires_grad_(True)
    with pytest.raises(ValueError, match="convolution conv_out of Encoder: its weight is trainable"):
        enable_fp8_conv_storage(trainable)
    assert not is_fp8_conv(trainable.conv_in)  # every layer is checked before any changes
    with pytest.raises(ValueError, match="no convolution layer"):
        enable_fp8_conv_storage(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_a_converted_weight_made_trainable_is_refused_at_use():
    model = Encoder()
    enable_fp8_conv_storage(model)
    model.requires_grad_(True)
    with pytest.raises(RuntimeError, match="fp8 convolution weight was made trainable"):
        model(torch.randn(1, 3, 2, 8, 8))
