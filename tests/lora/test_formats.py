"""Writing and reading the LoRA layouts: folded scales read once, per-layer scales, refusals with the file named."""

import json

import pytest
import torch
from safetensors.torch import save_file

from diffsynth.lora import LAYOUTS, LoRALayer, LoRAWeights, read_lora, to_state_dict
from diffsynth.pipelines.wan_video.naming import NAMING as WAN_NAMING
from diffsynth.lora.formats import FOLDED_SCALE_KEY, write_lora

WAN_LAYERS = {"blocks.0.attn1.to_q": (4, 6), "blocks.1.attn2.add_k_proj": (4, 6), "proj_out": (3, 4)}


def wan_weights(scales=(0.5, 0.5, 0.5)):
    generator = torch.Generator().manual_seed(0)
    layers = {}
    for (name, (out, inp)), scale in zip(WAN_LAYERS.items(), scales):
        layers[name] = LoRALayer(torch.randn(2, inp, generator=generator), torch.randn(out, 2, generator=generator),
                                 scale)
    return LoRAWeights(layers)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("scales", [(0.5, 0.5, 0.5), (0.5, 2.0, 1.0)])
def test_each_layout_reads_back_the_same_updates(tmp_path, layout, scales):
    weights = wan_weights(scales)
    path = write_lora(tmp_path / "lora.safetensors", weights, layout, WAN_NAMING)
    for module_names in (list(WAN_LAYERS), None):  # kohya's underscored names need the model's layer names
        if module_names is None and layout == "kohya":
            continue
        back = read_lora(path, module_names, WAN_NAMING)
        assert back.layout == layout and back.layers.keys() == weights.layers.keys()
        for name, layer in weights.layers.items():
            torch.testing.assert_close(back.layers[name].delta(), layer.delta())
            assert back.layers[name].scale == pytest.approx(layer.scale)  # the trained factors come back


def test_the_universal_layout_folds_the_scale_and_records_it(tmp_path):
    tensors, metadata = to_state_dict(wan_weights(), "universal", WAN_NAMING)
    layer = wan_weights().layers["blocks.1.attn2.add_k_proj"]
    torch.testing.assert_close(tensors["diffusion_model.blocks.1.cross_attn.k_img.lora_B.weight"], layer.up * 0.5)
    assert float(metadata[FOLDED_SCALE_KEY]) == 0.5 and metadata["diffsynth.lora.layout"] == "universal"
    assert "diffusion_model.head.head.lora_A.weight" in tensors and not [k for k in tensors if k.endswith("alpha")]
    # Without the record, every tool (and this reader) takes the folded factors at face value: strength 1 is kept.
    save_file(tensors, str(tmp_path / "bare.safetensors"))
    bare = read_lora(tmp_path / "bare.safetensors", naming=WAN_NAMING)
    torch.testing.assert_close(bare.layers["proj_out"].delta(), wan_weights().layers["proj_out"].delta())
    assert bare.layers["proj_out"].scale == 1.0


def test_kohya_alpha_wins_and_peft_metadata_is_read(tmp_path):
    down, up = torch.ones(2, 3), torch.ones(4, 2)
    save_file({"lora_unet_blocks_0_self_attn_q.lora_down.weight": down, "lora_unet_blocks_0_self_attn_q.lora_up.weight":
               up, "lora_unet_blocks_0_self_attn_q.alpha": torch.tensor(1.0)}, str(tmp_path / "kohya.safetensors"))
    layer = read_lora(tmp_path / "kohya.safetensors", ["blocks.0.attn1.to_q"], WAN_NAMING).layers
    assert layer["blocks.0.attn1.to_q"].scale == 0.5
    save_file({"transformer.blocks.0.attn1.to_q.lora_A.weight": down, "transformer.blocks.0.attn1.to_q.lora_B.weight":
               up}, str(tmp_path / "peft.safetensors"),
              metadata={"lora_adapter_metadata": json.dumps({"transformer.r": 2, "transformer.lora_alpha": 6})})
    weights = read_lora(tmp_path / "peft.safetensors", naming=WAN_NAMING)
    assert weights.layers["blocks.0.attn1.to_q"].scale == 3.0 and weights.layout == "diffusers"


def test_bad_files_are_refused_with_the_file_named(tmp_path):
    nan = tmp_path / "diverged.safetensors"
    save_file({"diffusion_model.proj_out.lora_A.weight": torch.tensor([[float("nan"), 0.0]]),
               "diffusion_model.proj_out.lora_B.weight": torch.ones(1, 1)}, str(nan))
    with pytest.raises(ValueError, match=rf"{nan}.*NaN or inf values in 1 of 2 tensors \(diffusion_model.proj_out"):
        read_lora(nan)
    pickle = tmp_path / "lora.pth"
    torch.save({"a": torch.ones(1)}, pickle)
    with pytest.raises(ValueError, match=r"not .safetensors; only safetensors are read \(no pickles\)"):
        read_lora(pickle)
    renamed = tmp_path / "renamed.safetensors"
    renamed.write_bytes(pickle.read_bytes())
    with pytest.raises(ValueError, match=rf"{renamed}.*not a readable safetensors file.*pickle renamed"):
        read_lora(renamed)
    with pytest.raises(ValueError, match="has no name in the original Wan code"):
        to_state_dict(LoRAWeights({"blocks.0.norm2": LoRALayer(torch.ones(1, 2), torch.ones(2, 1))}), "universal",
                      WAN_NAMING)
    folded = tmp_path / "zero.safetensors"
    save_file({"proj_out.lora_A.weight": torch.ones(1, 2), "proj_out.lora_B.weight": torch.ones(2, 1)}, str(folded),
              metadata={FOLDED_SCALE_KEY: "0"})
    with pytest.raises(ValueError, match="must be a non-zero finite number"):
        read_lora(folded)


def test_a_scale_folded_into_float16_that_overflows_is_not_written(tmp_path):
    from diffsynth.core.finite import NonFiniteTensorError

    big = LoRAWeights({"proj_out": LoRALayer(torch.ones(1, 2), torch.full((2, 1), 60000.0), 4.0)})
    with pytest.raises(NonFiniteTensorError, match="not writing LoRA file"):
        write_lora(tmp_path / "big.safetensors", big, "universal", WAN_NAMING, dtype=torch.float16)
    assert not (tmp_path / "big.safetensors").exists()
    write_lora(tmp_path / "big.safetensors", big, "kohya", WAN_NAMING, dtype=torch.float16)  # unfolded: fits
