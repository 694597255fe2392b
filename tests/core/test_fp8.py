"""fp8 storage of frozen Linear weights: bytes, accuracy, LoRA training, checkpointing, offloading, refusals."""

import copy

import pytest
import torch
from peft import LoraConfig
from safetensors.torch import load_file, save_file
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from diffsynth.core import (Fp8Linear, OffloadTrainingManager, enable_fp8_storage, fp8 as fp8_module,
                            nbytes_by_dtype)
from diffsynth.core.fp8 import dequantize_fp8, quantize_fp8
from tests.core.offload_training.test_diffusers_models import lora_train, tiny_qwen_image, tiny_wan

FP8 = torch.float8_e4m3fn
BUILDS = pytest.mark.parametrize("build", [tiny_qwen_image, tiny_wan], ids=["qwen-image", "wan"])
# Relative error of a whole tiny transformer's output against float32 (measured 3.4% Qwen-Image, 2.5% Wan).
MODEL_TOLERANCE = 0.05


def frozen(build):
    model, targets, inputs = build()
    return model.requires_grad_(False), targets, inputs


def add_lora(model, targets, seed=1):
    torch.manual_seed(seed)
    model.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=targets, init_lora_weights="gaussian"))
    return model


def relative_error(actual, expected):
    return ((actual.float() - expected.float()).norm() / expected.float().norm()).item()


def linear_weight_bytes(model):
    return sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, torch.nn.Linear))


def moved_bytes(model):
    manager = OffloadTrainingManager(model, "cpu")
    total = sum(unit.offloaded_nbytes for unit in manager.units)
    manager.remove()
    return total


class FloatOpRecorder(TorchDispatchMode):
    """Records every aten op that receives a float8 tensor."""

    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(isinstance(t, torch.Tensor) and t.dtype == FP8 for t in tree_leaves((args, kwargs))):
            self.ops.add(func.__name__.split(".")[0])
        return func(*args, **kwargs)


# ---- scaling -------------------------------------------------------------------------------------------------------


def test_scaled_quantization_error_is_about_three_mantissa_bits():
    torch.manual_seed(0)
    layer = frozen(tiny_qwen_image)[0].transformer_blocks[0].attn.to_q.weight
    for weight in (torch.randn(256, 256), layer, torch.randn(64, 64) * 1e-4, torch.randn(64, 64) * 300):
        for per_channel in (True, False):
            weight_fp8, scale = quantize_fp8(weight, per_channel)
            assert weight_fp8.dtype == FP8 and scale.dtype == weight.dtype
            assert relative_error(dequantize_fp8(weight_fp8, scale, torch.float32), weight) < 0.03
    # Why scale at all: a plain cast flushes small weights to zero and clips large ones.
    small, large = torch.randn(64, 64) * 1e-4, torch.randn(64, 64) * 300
    assert relative_error(small.to(FP8), small) > 0.9 and relative_error(large.to(FP8), large) > 0.1
    assert not dequantize_fp8(*quantize_fp8(torch.zeros(3, 4)), torch.float32).any()


def test_per_channel_scales_keep_small_rows_accurate_next_to_outliers():
    torch.manual_seed(0)
    weight = torch.cat([torch.randn(15, 64) * 1e-5, torch.randn(1, 64) * 10])
    per_row = {pc: dequantize_fp8(*quantize_fp8(weight, pc), torch.float32) for pc in (True, False)}
    assert relative_error(per_row[True][:15], weight[:15]) < 0.03
    assert relative_error(per_row[False][:15], weight[:15]) > 0.1


# ---- bytes ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,ratio", [(torch.bfloat16, 2), (torch.float32, 4)], ids=["bf16", "fp32"])
def test_weight_bytes_halve_against_bf16_and_quarter_against_fp32(dtype, ratio):
    model = frozen(tiny_qwen_image)[0].to(dtype)
    before = linear_weight_bytes(model)
    moved_before = moved_bytes(copy.deepcopy(model))
    storage = enable_fp8_storage(model)
    scales = sum(m.weight_scale.numel() * m.weight_scale.element_size() for m in model.modules()
                 if isinstance(m, Fp8Linear))
    assert storage.bytes_before == before
    assert nbytes_by_dtype(model)[FP8] == before // ratio
    assert storage.bytes_after == before // ratio + scales
    assert str(len(storage.layer_names)) in storage.summary()
    # The offload manager moves exactly the bytes saved fewer.
    assert moved_bytes(model) == moved_before - storage.saved_bytes


# ---- accuracy and what computes in fp8 -----------------------------------------------------------------------------


@BUILDS
def test_forward_stays_close_to_the_float32_model_and_nothing_computes_in_fp8(build):
    model, _, inputs = frozen(build)
    with torch.no_grad():
        expected = model(**inputs)[0]
        enable_fp8_storage(model)
        with FloatOpRecorder() as recorder:
            actual = model(**inputs)[0]
    assert relative_error(actual, expected) < MODEL_TOLERANCE
    # fp8 tensors are only ever converted (up-cast), never fed to a matmul or any other computation.
    assert recorder.ops == {"_to_copy"}


def test_bf16_model_computes_in_bf16_and_to_dtype_keeps_the_fp8_storage():
    model, _, inputs = frozen(tiny_wan)
    with torch.no_grad():
        expected = model(**inputs)[0]
        enable_fp8_storage(model)
        model.to(torch.bfloat16)
        layer = model.blocks[0].attn1.to_q
        assert layer.weight.dtype == FP8 and layer.weight_scale.dtype == torch.bfloat16
        bf16_inputs = {k: v.bfloat16() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                       for k, v in inputs.items()}
        actual = model(**bf16_inputs)[0]
    assert actual.dtype == torch.bfloat16
    assert relative_error(actual, expected) < MODEL_TOLERANCE


def test_autocast_and_compute_dtype_choose_the_upcast_dtype(monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 4)).requires_grad_(False)
    enable_fp8_storage(model)
    dtypes = []

    def recording_dequantize(weight_fp8, scale, dtype):
        dtypes.append(dtype)
        return dequantize_fp8(weight_fp8, scale, dtype)

    monkeypatch.setattr(fp8_module, "dequantize_fp8", recording_dequantize)
    x = torch.randn(2, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    out.float().sum().backward()
    assert out.dtype == torch.bfloat16 and x.grad.dtype == torch.float32
    assert set(dtypes) == {torch.bfloat16}
    dtypes.clear()
    model[0].compute_dtype = model[2].compute_dtype = torch.float64
    assert model(torch.randn(2, 8)).dtype == torch.float64 and set(dtypes) == {torch.float64}


# ---- LoRA, gradient checkpointing, offloading ----------------------------------------------------------------------


@BUILDS
def test_lora_on_fp8_base_trains_lora_only_and_loss_falls(build):
    model, targets, inputs = frozen(build)
    reference = add_lora(copy.deepcopy(model), targets)
    enable_fp8_storage(add_lora(model, targets))
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n and p.dtype == torch.float32 for n, p in trainable.items())
    for net in (reference, model):
        net(**inputs)[0].square().mean().backward()
    # Gradients reach exactly the LoRA weights they reach on the full-precision base, and nothing frozen.
    with_grad = [{n for n, p in net.named_parameters() if p.grad is not None} for net in (reference, model)]
    assert with_grad[0] == with_grad[1] and with_grad[1] <= set(trainable)
    optimizer = torch.optim.AdamW(trainable.values(), lr=1e-2)
    optimizer.zero_grad()
    torch.manual_seed(0)
    target = torch.randn_like(model(**inputs)[0])
    losses = []
    for _ in range(4):
        loss = (model(**inputs)[0] - target).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert all(later < earlier for earlier, later in zip(losses, losses[1:]))


@BUILDS
def test_converting_before_or_after_lora_injection_gives_the_same_training(build):
    model, targets, inputs = frozen(build)
    after = enable_fp8_storage(add_lora(copy.deepcopy(model), targets)).module
    before = add_lora(enable_fp8_storage(copy.deepcopy(model)).module, targets)
    assert all(p.dtype == torch.float32 for n, p in before.named_parameters() if ".lora_" in n)
    assert isinstance(before.transformer_blocks[0].attn.to_q.base_layer if build is tiny_qwen_image
                      else before.blocks[0].attn1.to_q.base_layer, Fp8Linear)
    assert torch.equal(lora_train(before, inputs), lora_train(after, inputs))


@BUILDS
def test_gradient_checkpointing_recomputes_the_upcast(build, monkeypatch):
    model, targets, inputs = frozen(build)
    enable_fp8_storage(add_lora(model, targets))
    checkpointed = copy.deepcopy(model)
    checkpointed.enable_gradient_checkpointing()
    calls = []
    monkeypatch.setattr(fp8_module, "dequantize_fp8", lambda *args: calls.append(1) or dequantize_fp8(*args))

    def gradients_and_upcasts(net):
        calls.clear()
        net(**inputs)[0].square().mean().backward()
        return {n: p.grad for n, p in net.named_parameters() if p.requires_grad}, len(calls)

    plain, plain_upcasts = gradients_and_upcasts(model)
    recomputed, recomputed_upcasts = gradients_and_upcasts(checkpointed)
    assert recomputed_upcasts > plain_upcasts
    for name, grad in plain.items():
        torch.testing.assert_close(recomputed[name], grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("build,checkpointing", [(tiny_qwen_image, True), (tiny_wan, False)],
                         ids=["qwen-image-checkpointing", "wan"])
def test_offload_manager_on_fp8_base_equals_training_without_it(build, checkpointing):
    model, targets, inputs = frozen(build)
    enable_fp8_storage(add_lora(model, targets))
    if checkpointing:
        model.enable_gradient_checkpointing()
    offloaded = copy.deepcopy(model)
    expected = lora_train(model, inputs)
    manager = OffloadTrainingManager(offloaded, "cpu")
    with FloatOpRecorder() as recorder:
        losses = lora_train(offloaded, inputs, manager=manager)
    manager.remove()
    # Only copies and metadata ops (the device pool lends flat byte buffers viewed as the fp8 weight): no fp8 math.
    assert recorder.ops <= {"_to_copy", "copy_", "empty_like", "as_strided", "view", "detach"}
    torch.testing.assert_close(losses, expected, rtol=0, atol=1e-6)
    trained = dict(offloaded.named_parameters())
    for name, param in model.named_parameters():
        assert trained[name].dtype == param.dtype
        torch.testing.assert_close(trained[name].float(), param.float(), rtol=0, atol=1e-6)


# ---- state dict, exclusion, removal --------------------------------------------------------------------------------


def test_state_dict_round_trips_and_full_precision_weights_are_quantized_on_load(tmp_path):
    reference, _, inputs = frozen(tiny_wan)
    model = enable_fp8_storage(copy.deepcopy(reference)).module
    state = model.state_dict()
    assert state["blocks.0.attn1.to_q.weight"].dtype == FP8
    assert state["blocks.0.attn1.to_q.weight_scale"].shape == (32, 1)
    save_file(state, tmp_path / "fp8.safetensors")
    reloaded = enable_fp8_storage(copy.deepcopy(reference)).module
    reloaded.load_state_dict(load_file(tmp_path / "fp8.safetensors"))
    requantized = enable_fp8_storage(copy.deepcopy(reference)).module
    requantized.load_state_dict(reference.state_dict())
    with torch.no_grad():
        expected = model(**inputs)[0]
        assert torch.equal(reloaded(**inputs)[0], expected)
        assert torch.equal(requantized(**inputs)[0], expected)


def test_exclude_keeps_layers_and_remove_restores_plain_linears():
    model, _, inputs = frozen(tiny_qwen_image)
    storage = enable_fp8_storage(model, exclude=["proj_out", "transformer_blocks.1"])
    assert type(model.proj_out) is torch.nn.Linear and type(model.transformer_blocks[1].attn.to_q) is torch.nn.Linear
    assert isinstance(model.transformer_blocks[0].attn.to_q, Fp8Linear)
    assert not any("proj_out" in n or "transformer_blocks.1." in n for n in storage.layer_names)
    with torch.no_grad():
        expected = model(**inputs)[0]
        assert storage.remove() == len(storage.layer_names)
        restored = model(**inputs)[0]
    assert not any(isinstance(m, Fp8Linear) for m in model.modules())
    assert model.transformer_blocks[0].attn.to_q.weight.dtype == torch.float32
    torch.testing.assert_close(restored, expected, rtol=1e-5, atol=1e-6)


def test_layers_whose_weight_is_read_elsewhere_stay_as_they_are():
    embed = torch.nn.Embedding(8, 4)
    head = torch.nn.Linear(4, 8, bias=False)
    head.weight = embed.weight
    model = torch.nn.ModuleDict(dict(embed=embed, head=head, attention=torch.nn.MultiheadAttention(4, 1),
                                     proj=torch.nn.Linear(4, 4))).requires_grad_(False)
    assert enable_fp8_storage(model).layer_names == ["proj"]
    assert model["head"] is head and type(model["attention"].out_proj) is not Fp8Linear


# ---- refusals ------------------------------------------------------------------------------------------------------


def test_refusals_name_the_problem_and_the_fix(monkeypatch):
    model = frozen(tiny_wan)[0]
    model.blocks[0].attn1.to_q.requires_grad_(True)
    with pytest.raises(ValueError, match=r"blocks\.0\.attn1\.to_q.*frozen weights.*stay in their dtype"):
        enable_fp8_storage(model)
    enable_fp8_storage(model, exclude=["blocks.0.attn1.to_q"])
    with pytest.raises(ValueError, match="already"):
        enable_fp8_storage(model, exclude=["blocks.0.attn1.to_q"])
    with pytest.raises(ValueError, match="no torch.nn.Linear layer"):
        enable_fp8_storage(torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1), torch.nn.ReLU()))
    with pytest.raises(ValueError, match="bare Linear.*Fp8Linear.from_linear"):
        enable_fp8_storage(torch.nn.Linear(4, 4).requires_grad_(False))
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 4)).requires_grad_(False)
    for kwargs, message in [(dict(compute_dtype=FP8), "nothing computes in fp8"), (dict(exclude="0"), "list"),
                            (dict(exclude=["nope"]), r"\['nope'\] match no Linear"), (dict(per_channel=1), "True")]:
        with pytest.raises(ValueError, match=message):
            enable_fp8_storage(fresh, **kwargs)
    manager = OffloadTrainingManager(fresh, "cpu")
    with pytest.raises(ValueError, match="before building the OffloadTrainingManager"):
        enable_fp8_storage(fresh)
    manager.remove()
    monkeypatch.delattr(torch, "float8_e4m3fn")
    with pytest.raises(RuntimeError, match="float8_e4m3fn.*torch >= 2.1"):
        enable_fp8_storage(fresh)


def test_fp8_layers_refuse_training_and_fp8_inputs():
    model = enable_fp8_storage(torch.nn.Sequential(torch.nn.Linear(4, 4)).requires_grad_(False)).module
    with pytest.raises(RuntimeError, match="float8 input.*exclude"):
        model(torch.randn(2, 4).to(FP8))
    model.requires_grad_(True)
    with pytest.raises(RuntimeError, match="frozen storage"):
        model(torch.randn(2, 4))
