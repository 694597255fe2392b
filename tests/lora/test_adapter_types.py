"""LoHa, LoKr and DoRA files: written from peft's trained weights, read back, merged and seen by ComfyUI's emulation
with exactly the weight change peft's own ``merge`` makes; the conventions ComfyUI needs (a LoKr of whole factors
without alpha, DoRA's ``dora_scale`` normalised by the base weight) are what make them equal."""

import copy

import pytest
import torch

from diffsynth.lora import load_lora, read_lora
from diffsynth.lora.adapters import DORA_EPS, TYPE_KEY
from diffsynth.lora.formats import to_state_dict, write_lora
from diffsynth.lora.peft_adapters import peft_values, weights_from_peft
from diffsynth.lora.tools import tool_layers
from diffsynth.training.objective.adapter import AdapterSettings, DoraBaseWeights, inject_adapter

ALPHA = 3.0  # alpha != rank: a scale read as 1 (or applied twice) is off


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.attn = torch.nn.Linear(32, 48)
        self.ffn = torch.nn.Linear(48, 64)

    def forward(self, x):
        return self.ffn(self.attn(x))


CASES = {
    "loha": AdapterSettings("loha", rank=4, alpha=ALPHA),
    "lokr whole factors": AdapterSettings("lokr", rank=8, alpha=ALPHA),
    "lokr decomposed": AdapterSettings("lokr", rank=1, alpha=ALPHA),
    "lora+dora": AdapterSettings("lora", rank=4, alpha=ALPHA, use_dora=True),
}


def trained(settings: AdapterSettings, seed: int = 1) -> torch.nn.Module:
    """A Net with the adapter injected and every adapter weight moved at random, as training would."""
    model = Net()
    inject_adapter(model, settings, ["attn", "ffn"])
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.requires_grad:
                param.add_(torch.randn(param.shape, generator=generator) * 0.2)
    return model


def peft_deltas(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Each adapted layer's weight change by peft's own merge."""
    merged, deltas = copy.deepcopy(model), {}
    for name in ("attn", "ffn"):
        layer = merged.get_submodule(name)
        before = layer.get_base_layer().weight.detach().clone()
        layer.merge()
        deltas[name] = layer.get_base_layer().weight.detach() - before
    return deltas


def file_weights(model: torch.nn.Module, settings: AdapterSettings):
    state = {name: param.detach() for name, param in model.named_parameters() if param.requires_grad}
    return weights_from_peft(state, settings.alpha, settings.rank, base_weights=DoraBaseWeights(model))


@pytest.mark.parametrize("layout", ["universal", "kohya"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_file_merges_and_loads_in_comfyui_as_peft_merges(case, layout, tmp_path):
    settings = CASES[case]
    model = trained(settings)
    want = peft_deltas(model)
    path = write_lora(tmp_path / "adapter.safetensors", file_weights(model, settings), layout)
    merged, base = Net(), Net()
    assert load_lora(merged, path) == 2
    for name in want:
        got = merged.get_submodule(name).weight - base.get_submodule(name).weight
        assert (got - want[name]).abs().max() < 1e-5, name
    from safetensors import safe_open
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    with safe_open(str(path), "pt") as handle:
        metadata = handle.metadata()
    assert metadata[TYPE_KEY] == settings.kind
    shapes = {name: base.get_submodule(name).weight.shape for name in want}
    applied, unused = tool_layers("ComfyUI", tensors, metadata, "Net", shapes)
    assert not unused and applied.keys() == want.keys()
    for name in want:
        got = applied[name].delta(base=base.get_submodule(name).weight.detach())
        assert (got - want[name]).abs().max() < 1e-5, name


@pytest.mark.parametrize("case", list(CASES))
def test_the_file_loads_back_into_peft_with_the_same_change(case, tmp_path):
    from peft import set_peft_model_state_dict

    settings = CASES[case]
    model = trained(settings)
    path = write_lora(tmp_path / "adapter.safetensors", file_weights(model, settings), "universal")
    fresh = Net()
    inject_adapter(fresh, settings, ["attn", "ffn"])
    weights = read_lora(path, ["attn", "ffn"])
    values = peft_values(weights, settings.scale, DoraBaseWeights(fresh), adapter=None)
    result = set_peft_model_state_dict(fresh, values)
    assert not result.unexpected_keys
    want, got = peft_deltas(model), peft_deltas(fresh)
    assert all((got[name] - want[name]).abs().max() < 1e-5 for name in want)


def test_a_lokr_of_whole_factors_folds_its_scale_since_comfyui_ignores_its_alpha():
    settings = CASES["lokr whole factors"]
    model = trained(settings)
    tensors, _ = to_state_dict(file_weights(model, settings), "universal")
    assert "diffusion_model.attn.lokr_w1" in tensors and not any(key.endswith(".alpha") for key in tensors)
    # The factor holds alpha / rank: peft's w1 times the scale.
    peft_w1 = model.attn.lokr_w1["default"].detach()
    assert torch.allclose(tensors["diffusion_model.attn.lokr_w1"], peft_w1 * settings.scale)
    decomposed = to_state_dict(file_weights(trained(CASES["lokr decomposed"]), CASES["lokr decomposed"]),
                               "universal")[0]
    assert float(decomposed["diffusion_model.attn.alpha"]) == ALPHA and "diffusion_model.attn.lokr_w2_a" in decomposed


def test_dora_scale_is_the_magnitude_renormalised_to_the_base_weight_for_comfyui(tmp_path):
    settings = CASES["lora+dora"]
    model = trained(settings)
    tensors, _ = to_state_dict(file_weights(model, settings), "universal")
    layer = model.attn
    magnitude = layer.lora_magnitude_vector["default"].weight.detach()
    weight = layer.get_base_layer().weight.detach()
    change = settings.scale * layer.lora_B["default"].weight.detach() @ layer.lora_A["default"].weight.detach()
    expected = magnitude * (weight.norm(dim=1) + DORA_EPS) / (weight + change).norm(dim=1)
    stored = tensors["diffusion_model.attn.dora_scale"]
    assert stored.shape == (48, 1)  # ComfyUI divides it by the (out, 1) row norms
    assert torch.allclose(stored.flatten(), expected) and not torch.allclose(stored.flatten(), magnitude, atol=1e-3)
    # LyCORIS's own convention (the magnitude itself) would give ComfyUI another weight: the test above has teeth.
    lycoris = {**tensors, "diffusion_model.attn.dora_scale": magnitude.reshape(48, 1)}
    applied, _ = tool_layers("ComfyUI", lycoris, {}, "Net", {"attn": weight.shape, "ffn": model.ffn.weight.shape})
    assert (applied["attn"].delta(base=weight) - peft_deltas(model)["attn"]).abs().max() > 1e-3


def test_other_layouts_and_adapter_mixes_are_refused():
    weights = file_weights(trained(CASES["loha"]), CASES["loha"])
    for layout in ("diffusers", "peft"):
        with pytest.raises(ValueError, match="universal or kohya layout.*diffusers' load_lora_weights"):
            to_state_dict(weights, layout)
    tensors, metadata = to_state_dict(weights, "universal")
    broken = {key: value for key, value in tensors.items() if not key.endswith("hada_w2_b")}
    with pytest.raises(ValueError, match=r"lacks \['hada_w2_b'\]"):
        read_lora(broken, ["attn", "ffn"])
    with pytest.raises(ValueError, match="DoRA layer .* needs its base weight"):
        peft_values(file_weights(trained(CASES["lora+dora"]), CASES["lora+dora"]), 1.0, {})
