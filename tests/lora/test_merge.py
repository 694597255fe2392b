"""load_lora against peft's unmerged adapters (and diffusers' loader) on a small model and a tiny Qwen-Image DiT."""

import copy
import json
import logging

import pytest
import torch
from peft import LoraConfig, inject_adapter_in_model
from peft.utils import get_peft_model_state_dict
from safetensors.torch import save_file

from diffsynth.lora import load_lora
from diffsynth.lora.formats import STRIPPED_PREFIXES

PREFIXES = ["", *STRIPPED_PREFIXES]


class Small(torch.nn.Module):
    """Linear, Conv2d and Conv3d layers in a row, so every supported target kind is exercised."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 16)
        self.conv = torch.nn.Conv2d(16, 6, 3, padding=1)
        self.conv3 = torch.nn.Conv3d(6, 4, (1, 3, 3), padding=(0, 1, 1))
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x):
        x = self.proj(x.movedim(1, -1)).movedim(-1, 1)
        x = self.conv3(self.conv(x).unsqueeze(2)).squeeze(2)
        return self.head(x.movedim(1, -1))


def with_adapter(base, config):
    """A copy of ``base`` with an unmerged peft adapter, and that adapter's state dict (keys without adapter name)."""
    adapted = inject_adapter_in_model(config, copy.deepcopy(base))
    return adapted, {key: value.detach().clone() for key, value in get_peft_model_state_dict(adapted).items()}


def to_format(state_dict, layout, prefix="", alpha=None):
    """Rewrites peft keys into one of the layouts load_lora accepts."""
    converted = {}
    for key, value in state_dict.items():
        if layout == "peft_adapter_name":
            key = key.replace(".weight", ".default.weight")
        elif layout == "kohya":
            key = key.replace(".lora_A.", ".lora_down.").replace(".lora_B.", ".lora_up.")
            if ".lora_down." in key and alpha is not None:
                converted[prefix + key.replace(".lora_down.weight", ".alpha")] = torch.tensor(float(alpha))
        converted[prefix + key] = value
    return converted


@pytest.fixture(scope="module")
def small():
    torch.manual_seed(0)
    base = Small()
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["proj", "conv", "conv3"], init_lora_weights=False)
    adapted, state_dict = with_adapter(base, config)
    x = torch.randn(2, 8, 5, 5)
    with torch.no_grad():
        expected, plain = adapted(x), base(x)
    assert (expected - plain).abs().max() > 1e-2  # the adapter really changes the output
    return base, state_dict, x, expected


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("layout", ["peft_flat_metadata", "peft_adapter_name", "kohya"])
def test_every_layout_and_prefix_reproduces_the_adapter(small, tmp_path, layout, prefix):
    base, state_dict, x, expected = small
    converted = to_format(state_dict, layout, prefix, alpha=8)
    # peft keys carry no alpha: it comes from the metadata, flat or as diffusers' JSON (under a component prefix).
    metadata = {
        "peft_flat_metadata": {"lora_alpha": "8", "rank": "4"},
        "peft_adapter_name": {"lora_adapter_metadata": json.dumps({"transformer.lora_alpha": 8, "transformer.r": 4})},
        "kohya": {},
    }[layout]
    path = tmp_path / "lora.safetensors"
    save_file(converted, str(path), metadata={"format": "pt", **metadata})
    model = copy.deepcopy(base)
    assert load_lora(model, path) == 3
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=0)


def test_without_any_alpha_the_scale_is_one(small):
    base, state_dict, x, _ = small
    reference, _ = with_adapter(base, LoraConfig(r=4, lora_alpha=4, target_modules=["proj", "conv", "conv3"]))
    set_peft_weights(reference, state_dict)
    model = copy.deepcopy(base)
    load_lora(model, state_dict)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), atol=1e-5, rtol=0)


def set_peft_weights(adapted, state_dict):
    from peft.utils import set_peft_model_state_dict

    result = set_peft_model_state_dict(adapted, state_dict)
    assert not [key for key in result.unexpected_keys if "lora" in key]


def test_alpha_scales_the_delta_and_keeps_dtype(small):
    base, state_dict, _, _ = small
    full, half = copy.deepcopy(base), copy.deepcopy(base)
    load_lora(full, state_dict, metadata={"lora_alpha": "8"})
    load_lora(half, state_dict, alpha=0.5, metadata={"lora_alpha": "8"})
    for name, weight in base.state_dict().items():
        torch.testing.assert_close(half.state_dict()[name] - weight, 0.5 * (full.state_dict()[name] - weight))
    low = copy.deepcopy(base).to(torch.bfloat16)
    load_lora(low, to_format(state_dict, "kohya", alpha=8))
    assert all(parameter.dtype == torch.bfloat16 for parameter in low.parameters())
    # One rounding, after the sum: the bf16 base weight plus the float32 delta.
    delta = full.proj.weight - base.proj.weight
    expected = (base.proj.weight.to(torch.bfloat16).float() + delta).to(torch.bfloat16)
    torch.testing.assert_close(low.proj.weight, expected, atol=0, rtol=0)


def test_diffusers_json_metadata_honours_alpha_pattern_and_rslora(small):
    base, state_dict, _, _ = small
    metadata = {"lora_adapter_metadata": json.dumps({"lora_alpha": 4, "alpha_pattern": {"conv": 12}, "r": 4})}
    model = copy.deepcopy(base)
    load_lora(model, state_dict, metadata=metadata)
    delta = state_dict["conv.lora_B.weight"].flatten(1) @ state_dict["conv.lora_A.weight"].flatten(1)
    torch.testing.assert_close(model.conv.weight - base.conv.weight, 3.0 * delta.reshape(base.conv.weight.shape))
    proj_delta = state_dict["proj.lora_B.weight"] @ state_dict["proj.lora_A.weight"]
    torch.testing.assert_close(model.proj.weight - base.proj.weight, proj_delta)
    rs = copy.deepcopy(base)
    load_lora(rs, state_dict, metadata={"lora_adapter_metadata": json.dumps({"lora_alpha": 4, "use_rslora": True})})
    torch.testing.assert_close(rs.proj.weight - base.proj.weight, 2.0 * proj_delta)
    # A plain lora_alpha entry (e.g. passed as metadata=) corrects the JSON.
    fixed = copy.deepcopy(base)
    load_lora(fixed, state_dict, metadata={"lora_adapter_metadata": json.dumps({"lora_alpha": 4}), "lora_alpha": "8"})
    torch.testing.assert_close(fixed.proj.weight - base.proj.weight, 2.0 * proj_delta)


def test_unmatched_layers_fail_unless_not_strict(small, caplog):
    base, state_dict, _, _ = small
    other = torch.nn.Sequential(torch.nn.Linear(8, 16))
    with pytest.raises(ValueError, match=r"3 of 3 LoRA layers .* e\.g\. \['proj'.*named like \['0'\]"):
        load_lora(other, state_dict)
    extra = dict(state_dict)
    extra.update({"text_encoder.fc.lora_A.weight": torch.ones(4, 2), "text_encoder.fc.lora_B.weight": torch.ones(2, 4)})
    before = copy.deepcopy(base)
    with pytest.raises(ValueError, match=r"1 of 4 .*'text_encoder.fc'.*strict=False"):
        load_lora(before, extra)
    assert all(torch.equal(a, b) for a, b in zip(before.parameters(), base.parameters()))
    with caplog.at_level(logging.WARNING, logger="diffsynth.lora.merge"):
        assert load_lora(copy.deepcopy(base), extra, strict=False) == 3
    assert "text_encoder.fc" in caplog.text


def test_bad_contents_give_clear_errors_and_leave_the_model_alone(small):
    base, state_dict, _, _ = small
    model = copy.deepcopy(base)
    missing_b = {key: value for key, value in state_dict.items() if key != "conv3.lora_B.weight"}
    with pytest.raises(ValueError, match=r"lack their down \(A\) or up \(B\) weight: \['conv3'\]"):
        load_lora(model, missing_b)
    wrong_shape = {**state_dict, "conv3.lora_A.weight": torch.ones(4, 5, 1, 3, 3)}
    with pytest.raises(ValueError, match=r"'conv3'.*does not fit module 'conv3' with weight \(4, 6, 1, 3, 3\)"):
        load_lora(model, wrong_shape)
    with pytest.raises(ValueError, match=r"not LoRA, DoRA \(dora_scale\).*lora_magnitude_vector"):
        load_lora(model, {**state_dict, "proj.lora_magnitude_vector.weight": torch.ones(16)})
    with pytest.raises(ValueError, match=r"not LoRA, DoRA.*is this a LoRA file"):
        load_lora(model, base.state_dict())
    with pytest.raises(ValueError, match="rank 4 but the metadata says rank 8"):
        load_lora(model, state_dict, metadata={"lora_alpha": "8", "rank": "8"})
    with pytest.raises(ValueError, match="alpha=nan"):
        load_lora(model, state_dict, alpha=float("nan"))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), base.parameters()))


def test_bad_files_give_clear_errors(small, tmp_path):
    base, state_dict, _, _ = small
    with pytest.raises(FileNotFoundError, match="nowhere.safetensors"):
        load_lora(base, tmp_path / "nowhere.safetensors")
    pickle = tmp_path / "lora.pt"
    torch.save(state_dict, pickle)
    with pytest.raises(ValueError, match=r"lora.pt' is not \.safetensors"):
        load_lora(base, pickle)
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    with pytest.raises(ValueError, match="broken.safetensors' is not a readable safetensors file"):
        load_lora(base, broken)


QWEN_TARGETS = ["to_q", "to_k", "to_v", "add_q_proj", "to_out.0", "to_add_out", "img_mlp.net.2", "txt_mod.1"]


@pytest.fixture(scope="module")
def qwen():
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(0)
    base = QwenImageTransformer2DModel(
        patch_size=2, in_channels=64, out_channels=16, num_layers=2, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=32, guidance_embeds=False, axes_dims_rope=(8, 4, 4),
    ).eval()
    inputs = dict(
        hidden_states=torch.randn(1, 16, 64), encoder_hidden_states=torch.randn(1, 7, 32),
        encoder_hidden_states_mask=torch.ones(1, 7), timestep=torch.tensor([0.6]), img_shapes=[(1, 4, 4)],
    )
    return base, inputs


def run(model, inputs):
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


@pytest.mark.parametrize(
    "layout,prefix", [("peft", ""), ("peft_adapter_name", "transformer."), ("kohya", "diffusion_model.")]
)
def test_qwen_image_transformer_matches_the_peft_adapter(qwen, layout, prefix):
    base, inputs = qwen
    config = LoraConfig(r=4, lora_alpha=4, target_modules=QWEN_TARGETS, init_lora_weights=False)
    adapted, state_dict = with_adapter(base, config)
    expected = run(adapted, inputs)
    assert (expected - run(base, inputs)).abs().max() > 1e-3
    model = copy.deepcopy(base)
    assert load_lora(model, to_format(state_dict, layout, prefix, alpha=4)) == len(state_dict) // 2 == 2 * 8
    torch.testing.assert_close(run(model, inputs), expected, atol=1e-5, rtol=0)


def test_qwen_image_file_saved_by_diffusers(qwen, tmp_path):
    from diffusers import QwenImagePipeline

    base, inputs = qwen
    config = LoraConfig(r=4, lora_alpha=8, target_modules=QWEN_TARGETS, init_lora_weights=False)
    adapted, state_dict = with_adapter(base, config)
    expected = run(adapted, inputs)
    QwenImagePipeline.save_lora_weights(
        tmp_path, transformer_lora_layers=state_dict, transformer_lora_adapter_metadata=config.to_dict()
    )
    path = tmp_path / "pytorch_lora_weights.safetensors"
    # diffusers' own loader reads the same file back to the adapter's output: the file is what diffusers expects.
    lora_state, lora_metadata = QwenImagePipeline.lora_state_dict(str(path), return_lora_metadata=True)
    reference = copy.deepcopy(base)
    reference.load_lora_adapter(lora_state, prefix="transformer", metadata=lora_metadata)
    torch.testing.assert_close(run(reference, inputs), expected, atol=1e-5, rtol=0)
    model = copy.deepcopy(base)
    assert load_lora(model, path) == 16
    torch.testing.assert_close(run(model, inputs), expected, atol=1e-5, rtol=0)
    # alpha=0.5 on a file with lora_alpha 8 is the same adapter at lora_alpha 4.
    half_adapter, _ = with_adapter(base, LoraConfig(r=4, lora_alpha=4, target_modules=QWEN_TARGETS))
    set_peft_weights(half_adapter, state_dict)
    halved = copy.deepcopy(base)
    load_lora(halved, path, alpha=0.5)
    torch.testing.assert_close(run(halved, inputs), run(half_adapter, inputs), atol=1e-5, rtol=0)


def test_a_lora_merges_into_4bit_weights_as_into_their_dequantized_ones():
    """An NF4 model (``--quant_options``, Ideogram 4's NF4 release) takes a merge layer by layer: the weight is
    unpacked, changed and packed again, so the merged layer computes what the dense merge computes, within one more
    4-bit rounding. Widths are multiples of 64 (bitsandbytes' CPU dequantization needs whole blocks per row)."""
    pytest.importorskip("bitsandbytes")
    from diffsynth.core.quant import QuantConfig, dense_weight, quantize_model

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 64)).requires_grad_(False)
    quantize_model(model, QuantConfig("bitsandbytes_nf4"))
    dense = torch.nn.Sequential(torch.nn.Linear(128, 64)).requires_grad_(False)
    dense[0].weight.copy_(dense_weight(model[0]))
    dense[0].bias.copy_(model[0].bias)
    lora = {"0.lora_A.weight": torch.randn(4, 128) / 8, "0.lora_B.weight": torch.randn(64, 4) / 4}
    assert load_lora(model, lora) == load_lora(dense, lora) == 1
    assert model[0].weight.quant_state is not None and tuple(model[0].weight.shape) != (64, 128)  # still packed
    inputs = torch.randn(8, 128)
    with torch.no_grad():
        merged, expected = model(inputs), dense(inputs)
    lora_output = inputs @ (lora["0.lora_B.weight"] @ lora["0.lora_A.weight"]).T
    error = ((merged - expected).norm() / expected.norm()).item()
    # Measured 0.09 (NF4's rounding of the merged weight) against the LoRA's own 0.77.
    assert error < 0.15 < (lora_output.norm() / expected.norm()).item(), error
