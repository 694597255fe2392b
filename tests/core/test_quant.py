"""4-bit NF4 storage of frozen Linear weights (bitsandbytes): configuration, exclusions, and the quantized model.

The configuration and the exclusion checks run anywhere; quantizing needs bitsandbytes (an optional dependency), so
those tests are skipped without it. bitsandbytes 0.50 runs NF4 on the CPU, so with it installed everything here runs
on the CPU; the CUDA path is a GPU test.
"""

import pytest
import torch
from peft import LoraConfig

from diffsynth.core.quant import QUANT_METHODS, QuantConfig, bitsandbytes_available, quantizable_layers, quantize_model
from tests.core.offload_training.test_diffusers_models import tiny_qwen_image

# The reference's exclusions for Qwen-Image (special/quant_training/Qwen-Image-2512-bitsandbytes_nf4.sh).
REFERENCE_EXCLUDE = ["img_mod.1", "txt_mod.1", "norm_out.linear", "img_in", "txt_in", "proj_out",
                     "timestep_embedder.linear_1", "timestep_embedder.linear_2"]
needs_bitsandbytes = pytest.mark.skipif(not bitsandbytes_available(), reason="bitsandbytes is not installed "
                                        "(optional: pip install -c constraints.txt bitsandbytes)")


def relative_error(actual, expected):
    return ((actual.float() - expected.float()).norm() / expected.float().norm()).item()


def test_unknown_methods_are_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="'bitsandbytes_int3' is unknown; the known methods are: bitsandbytes_nf4"):
        QuantConfig("bitsandbytes_int3")
    with pytest.raises(ValueError, match="must be a list of layer names"):
        QuantConfig("bitsandbytes_nf4", "proj_out")
    with pytest.raises(ValueError, match=r"exclude entries \['.proj'\]"):
        QuantConfig("bitsandbytes_nf4", [".proj"])
    assert set(QUANT_METHODS) == {"bitsandbytes_nf4"}


def test_exclusions_match_a_name_or_its_end_as_in_the_reference():
    config = QuantConfig("bitsandbytes_nf4", ["img_mod.1", "proj_out"])
    assert config.excludes("transformer_blocks.0.img_mod.1") and config.excludes("proj_out")
    assert not config.excludes("transformer_blocks.0.img_mod.10") and not config.excludes("proj_out_2")


def test_the_layers_to_quantize_are_found_on_a_weightless_model():
    with torch.device("meta"):
        model, _, _ = tiny_qwen_image()
    layers = quantizable_layers(model, QuantConfig("bitsandbytes_nf4", REFERENCE_EXCLUDE))
    assert "transformer_blocks.0.attn.to_q" in layers and "img_in" not in layers
    assert not any(name.endswith(("img_mod.1", "txt_mod.1")) for name in layers)
    with pytest.raises(ValueError, match=r"exclude entries \['img_mod.2'\] match no Linear layer"):
        quantizable_layers(model, QuantConfig("bitsandbytes_nf4", ["img_mod.2"]))


@pytest.mark.skipif(bitsandbytes_available(), reason="checks the message for a machine without bitsandbytes")
def test_quantizing_without_bitsandbytes_says_how_to_install_it():
    model, _, _ = tiny_qwen_image()
    with pytest.raises(ImportError, match="needs bitsandbytes, which is not installed; pip install"):
        quantize_model(model.requires_grad_(False), QuantConfig("bitsandbytes_nf4"))


def frozen_with_lora():
    model, targets, inputs = tiny_qwen_image()
    model.requires_grad_(False)
    torch.manual_seed(1)
    model.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=targets, init_lora_weights="gaussian"))
    return model, inputs


@needs_bitsandbytes
def test_a_quantized_model_keeps_its_exclusions_and_trains_a_lora_on_top():
    import bitsandbytes as bnb

    model, inputs = frozen_with_lora()
    expected = model(**inputs)[0]
    storage = quantize_model(model, QuantConfig("bitsandbytes_nf4", REFERENCE_EXCLUDE))
    assert type(model.img_in) is torch.nn.Linear and type(model.proj_out) is torch.nn.Linear
    assert isinstance(model.transformer_blocks[0].attn.to_q.base_layer, bnb.nn.Linear4bit)
    assert storage.bytes_after < 0.2 * storage.bytes_before  # float32 -> 4 bits plus block scales
    output = model(**inputs)[0]
    assert 0 < relative_error(output, expected) < 0.1
    output.float().pow(2).mean().backward()
    lora = {name: param for name, param in model.named_parameters() if "lora_" in name}
    assert lora and all(param.dtype == torch.float32 for param in lora.values())
    # On the quantized to_q of each block (lora_B starts at zero, so its gradient is the first to be non-zero).
    on_nf4 = [param for name, param in lora.items() if ".attn.to_q.lora_B" in name]
    assert len(on_nf4) == 2 and all(param.grad is not None and param.grad.abs().sum() > 0 for param in on_nf4)


@needs_bitsandbytes
@pytest.mark.gpu
def test_quantized_on_the_gpu_the_model_trains_there():
    model, inputs = frozen_with_lora()
    model = model.to("cuda")
    quantize_model(model, QuantConfig("bitsandbytes_nf4", REFERENCE_EXCLUDE))
    output = model(**{name: value.to("cuda") if isinstance(value, torch.Tensor) else value
                      for name, value in inputs.items()})[0]
    output.float().pow(2).mean().backward()
    assert all(param.grad is not None for name, param in model.named_parameters() if "lora_" in name)
