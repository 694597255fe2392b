"""The original-Wan layer names against diffusers' own converter of original Wan checkpoints."""

import pytest
import torch

from diffsynth.core.loader.tiny_models import QWEN_IMAGE_MODEL_ID, WAN_I2V_MODEL_ID, WAN_MODEL_ID
from diffsynth.lora import WAN_NAMING, ModuleNaming, lora_layer_names, naming_for


@pytest.mark.parametrize("model_id", [WAN_MODEL_ID, WAN_I2V_MODEL_ID])
def test_every_wan_lora_layer_has_the_name_diffusers_converts_from(tiny_root, model_id):
    from diffusers import WanTransformer3DModel
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    model = WanTransformer3DModel.from_pretrained(tiny_root / model_id / "transformer")
    names = lora_layer_names(model)
    assert naming_for(model) is WAN_NAMING and len(names) > 20
    for name in names:
        native = WAN_NAMING.to_native(name)
        assert native is not None, name
        # diffusers' checkpoint converter is an independent statement of the same map, key by key.
        converted = convert_wan_transformer_to_diffusers({f"{native}.weight": torch.zeros(1)})
        assert list(converted) == [f"{name}.weight"], (name, native)
        assert WAN_NAMING.to_diffusers(native) == name
    assert WAN_NAMING.to_native("blocks.0.norm2") is None and WAN_NAMING.to_diffusers("blocks.0.norm3") is None


def test_qwen_image_keeps_diffusers_names(tiny_root):
    from diffusers import QwenImageTransformer2DModel

    model = QwenImageTransformer2DModel.from_pretrained(tiny_root / QWEN_IMAGE_MODEL_ID / "transformer")
    naming = naming_for(model)
    assert all(naming.to_native(name) == name == naming.to_diffusers(name) for name in lora_layer_names(model))


def test_peft_wrappers_are_seen_through_and_a_naming_must_be_one_to_one():
    from peft import LoraConfig, inject_adapter_in_model

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2), torch.nn.Conv2d(2, 2, 1))
    inject_adapter_in_model(LoraConfig(r=1, target_modules=["0"]), model)
    assert lora_layer_names(model) == ["0", "2"]
    with pytest.raises(ValueError, match="maps two diffusers layers to one native name"):
        ModuleNaming("broken", top_layers={"a": "x", "b": "x"})
