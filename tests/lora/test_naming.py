"""The original-Wan layer names against diffusers' own converter of original Wan checkpoints."""

import pytest
import torch

from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID, WAN_I2V_MODEL_ID, WAN_MODEL_ID
from diffsynth.lora import ModuleNaming, lora_layer_names, naming_for
from diffsynth.pipelines.wan_video.naming import NAMING as WAN_NAMING


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


def test_every_bfl_flux1_name_is_the_one_diffusers_kohya_converter_reads():
    from diffusers.loaders.lora_pipeline import FluxLoraLoaderMixin

    from diffsynth.pipelines.flux.naming import BFL_NAMING as FLUX1_BFL_NAMING

    model_names = lora_layer_names_of_flux1()
    assert {FLUX1_BFL_NAMING.locate(name) is not None for name in model_names} == {True}
    generator = torch.Generator().manual_seed(0)
    state, ups = {}, {}
    for native in {FLUX1_BFL_NAMING.locate(name)[0] for name in model_names}:
        # diffusers splits linear1 at the released widths (3072 wide, MLP 12288); the other layers any size.
        width = 3072 if native.endswith("linear1") else 8
        rows = {"linear1": 7 * width, "qkv": 3 * width}.get(native.rsplit(".", 1)[-1], 6 * width)
        stem = "lora_unet_" + native.replace(".", "_")
        state[f"{stem}.lora_down.weight"] = torch.randn(1, width, generator=generator)
        state[f"{stem}.lora_up.weight"] = ups[native] = torch.randn(rows, 1, generator=generator)
    converted = FluxLoraLoaderMixin.lora_state_dict(state)
    found = {key.removeprefix("transformer.").removesuffix(".lora_B.weight"): value
             for key, value in converted.items() if key.endswith(".lora_B.weight")}
    # Its converter names the embedders and the final layer without "transformer." (load_lora_weights then drops
    # them); the names themselves are diffusers'.
    assert found.keys() == set(model_names)
    for native, up in ups.items():
        spec, names = FLUX1_BFL_NAMING.parts(native)
        width = state["lora_unet_" + native.replace(".", "_") + ".lora_down.weight"].shape[1]
        for name, rows in zip(names, spec.split_rows(up, width)):
            torch.testing.assert_close(found[name], rows)  # same rows, final modulation halves swapped back


def lora_layer_names_of_flux1():
    from accelerate import init_empty_weights
    from diffusers import FluxTransformer2DModel

    with init_empty_weights():
        model = FluxTransformer2DModel(num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
                                       joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=True,
                                       axes_dims_rope=(4, 6, 6))
    return lora_layer_names(model)


def test_every_wan_control_lora_layer_is_named_as_its_weight_in_the_original_release(tmp_path):
    """A LoRA layer's native name is the name its weight has in the original release files ComfyUI loads (written by
    ``dit_original_keys``), for VACE, FLF2V and the Fun models: the Fun ``ref_conv`` and camera adapter had none, so
    no universal or kohya file could name them."""
    from diffsynth.lora import inspect_lora
    from diffsynth.lora.formats import LoRALayer, LoRAWeights, write_lora
    from diffsynth.pipelines.wan_video.original import dit_original_keys
    from diffsynth.testing.tiny_wan_flf2v import tiny_flf2v_transformer
    from diffsynth.testing.tiny_wan_fun import FUN_RELEASES, tiny_fun_transformer
    from diffsynth.testing.tiny_wan_vace import tiny_wan_vace_transformer

    camera = tiny_fun_transformer(FUN_RELEASES["PAI/Wan2.1-Fun-V1.1-1.3B-Control-Camera"], 0)
    control = tiny_fun_transformer(FUN_RELEASES["PAI/Wan2.2-Fun-A14B-Control"], 0)
    for model in (tiny_wan_vace_transformer(0), tiny_flf2v_transformer(0), camera, control):
        naming, originals = naming_for(model), dit_original_keys(list(model.state_dict()))
        for name in lora_layer_names(model):
            native = naming.to_native(name)
            assert native is not None and f"{native}.weight" == originals[f"{name}.weight"], (name, native)
            assert naming.to_diffusers(native) == name
    extra = {"control_adapter.conv": camera, "control_adapter.residual_blocks.0.conv2": camera, "ref_conv": control}
    for name, model in extra.items():
        weight = model.get_submodule(name).weight
        layer = LoRALayer(torch.randn(2, *weight.shape[1:]), torch.randn(weight.shape[0], 2, *[1] * (weight.dim() - 2)))
        for layout in ("universal", "kohya"):
            path = write_lora(tmp_path / f"{layout}.safetensors", LoRAWeights({name: layer}), layout, naming_for(model))
            comfyui = inspect_lora(path, model).result("ComfyUI")
            assert comfyui.ok and comfyui.mapped == 1, (name, layout, comfyui)


def test_flux2_kohya_files_name_the_layers_of_the_bfl_release_checkpoint(tmp_path):
    """FLUX.2's kohya files name BFL's layers, the names of the released ``flux2-dev.safetensors`` that ComfyUI's
    Flux2 model holds (its key map has no ``lora_unet_`` name of a diffusers layer): diffusers' own single-file
    converter, an independent statement of those names, turns the fused weights the file's names spell back into each
    diffusers layer's weight, and the file reads back as the LoRA that was written."""
    import copy

    from diffusers.loaders.single_file_utils import convert_flux2_transformer_checkpoint_to_diffusers
    from safetensors.torch import load_file

    from diffsynth.lora import load_lora
    from diffsynth.lora.formats import LoRALayer, LoRAWeights, write_lora
    from diffsynth.pipelines.flux2_klein.naming import BFL_NAMING
    from diffsynth.testing.tiny_flux2 import tiny_flux2_transformer

    model = tiny_flux2_transformer(0, 1, 1, 16, guidance_embeds=True)
    state, names = model.state_dict(), lora_layer_names(model)
    release = {}
    for native in {BFL_NAMING.locate(name)[0] for name in names}:
        spec, parts = BFL_NAMING.parts(native)
        release[f"{native}.weight"] = spec.join_rows([state[f"{part}.weight"] for part in parts])
    converted = convert_flux2_transformer_checkpoint_to_diffusers(dict(release))
    assert converted.keys() == {f"{name}.weight" for name in names}
    for key, value in converted.items():
        torch.testing.assert_close(value, state[key], rtol=0, atol=0)  # rows in order, final halves swapped back

    generator = torch.Generator().manual_seed(0)
    weights = LoRAWeights({name: LoRALayer(torch.randn(2, model.get_submodule(name).in_features, generator=generator),
                                           torch.randn(model.get_submodule(name).out_features, 2, generator=generator),
                                           0.5) for name in names})
    kohya = write_lora(tmp_path / "kohya.safetensors", weights, "kohya", naming_for(model))
    stems = {key.split(".")[0] for key in load_file(str(kohya))}
    assert stems == {"lora_unet_" + key.removesuffix(".weight").replace(".", "_") for key in release}
    merged = {}
    for layout in ("kohya", "universal"):
        target = copy.deepcopy(model)
        load_lora(target, write_lora(tmp_path / f"{layout}.safetensors", weights, layout, naming_for(model)))
        merged[layout] = target.state_dict()
    changed = [key for key in state if not torch.equal(merged["universal"][key], state[key])]
    assert len(changed) == len(names)
    for key in changed:
        torch.testing.assert_close(merged["kohya"][key], merged["universal"][key])
