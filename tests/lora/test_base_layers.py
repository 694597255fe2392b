"""The base model's layer table that LoRA files record: exact for the released models, small, and enough to inspect."""

import json

import pytest
import torch
from accelerate import init_empty_weights
from safetensors import safe_open
from safetensors.torch import save_file

from diffsynth.core.quant import QuantConfig, bitsandbytes_available, quantize_model
from diffsynth.lora import inspect_lora, lora_layer_names
from diffsynth.lora.base_layers import LAYERS_KEY, BaseLayers
from diffsynth.lora.formats import MODEL_CONFIG_KEY
from diffsynth.training.outputs.logger import ModelLogger
from diffsynth.pipelines.registry import releases
from tests.core.offload_training.test_diffusers_models import tiny_qwen_image
from tests.lora.test_tools import RANK


def released(architecture):
    import diffusers

    family, release = releases()[architecture]
    with init_empty_weights(include_buffers=False):
        return getattr(diffusers, family.denoiser_class).from_config(dict(release.config))


@pytest.mark.parametrize("architecture", ["qwen-image", "wan2.1-t2v-14b", "flux.1-dev", "flux.2-klein-4b", "z-image"])
def test_the_table_of_a_released_model_reads_back_exactly_and_stays_small(architecture):
    model = released(architecture)
    layers = BaseLayers.of(model)
    assert layers.shapes == {name: model.get_submodule(name).weight.shape for name in lora_layer_names(model)}
    text = layers.to_metadata()
    assert BaseLayers.from_metadata(layers.model_class, text) == layers
    # One entry per layer of a block, not per layer: a few kB where the names alone are tens of kB.
    assert len(text) < 4096 < len(json.dumps(list(layers.shapes)))


def test_the_table_gives_declared_shapes_whatever_the_storage():
    plain = tiny_qwen_image()[0]
    expected = BaseLayers.of(plain)
    if not bitsandbytes_available():
        pytest.skip("bitsandbytes is not installed")
    quantize_model(plain.requires_grad_(False), QuantConfig("bitsandbytes_nf4"))
    assert any(module.weight.shape != (module.out_features, module.in_features) for module in plain.modules()
               if isinstance(module, torch.nn.Linear))  # packed: the weights' own shapes would be wrong
    assert BaseLayers.of(plain) == expected


def test_an_unreadable_table_is_refused_by_name():
    with pytest.raises(ValueError, match=LAYERS_KEY):
        BaseLayers.from_metadata("QwenImageTransformer2DModel", '[["blocks.#.to_q", [4, 4]]]')


def test_a_file_with_the_table_inspects_as_on_the_model_without_its_config(tmp_path):
    from peft import LoraConfig, inject_adapter_in_model

    base, targets, _ = tiny_qwen_image()
    model = inject_adapter_in_model(LoraConfig(r=RANK, lora_alpha=RANK, target_modules=targets), tiny_qwen_image()[0])
    state = {"pipe.dit." + key: value for key, value in model.named_parameters() if ".lora_" in key}
    config = {key: value for key, value in dict(base.config).items() if not key.startswith("_")}
    ModelLogger(tmp_path, "pipe.dit.", {"lora_rank": RANK, "base_model_class": type(base).__name__,
                                        "base_model_config": config,
                                        "base_model_layers": BaseLayers.of(model)}).save_lora(state, "file")
    path = tmp_path / "file.safetensors"
    with safe_open(str(path), framework="pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        metadata = handle.metadata()
    assert BaseLayers.from_metadata(type(base).__name__, metadata[LAYERS_KEY]) == BaseLayers.of(base)
    # Without the config the model could not be built: the table alone must carry the inspection.
    del metadata[MODEL_CONFIG_KEY]
    save_file(tensors, tmp_path / "table-only.safetensors", metadata)
    from_table = inspect_lora(tmp_path / "table-only.safetensors").as_dict()
    on_model = inspect_lora(path, base).as_dict()
    assert from_table["model_from"] == "the file's metadata"
    for key in ("layout", "model", "layers", "rank", "targets", "tools"):
        assert from_table[key] == on_model[key], key
    assert all(tool["mapped"] == tool["total"] > 0 for tool in from_table["tools"] if tool["tool"] != "musubi-tuner")
