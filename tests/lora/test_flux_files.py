"""FLUX.1 LoRA files: the universal layout (diffusers names under ``transformer.``) and the BFL kohya layout of
``--align_to_opensource_format`` (fused ``img_attn.qkv`` / ``linear1`` layers), in diffusers' real loader, the
ComfyUI, DiffSynth-Studio and musubi-tuner emulations, and this project's reader, at the trained strength.

diffusers runs for real: ``FluxPipeline.load_lora_weights`` on a pipeline of just the transformer, and
``FluxLoraLoaderMixin.lora_state_dict`` (its kohya converter) on fused layers of the released widths, which it
hard-codes (it cannot split a tiny model's ``linear1``).
"""

import copy
import math

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from diffsynth.lora import inspect_lora, load_lora, naming_for, read_lora
from diffsynth.lora.formats import LoRALayer, LoRAWeights, from_peft_state_dict, write_lora
from diffsynth.lora.naming import lora_layer_names
from diffsynth.pipelines.flux.naming import BFL_NAMING as FLUX1_BFL_NAMING
from tests.lora.conftest import random_lora_model

RANK, ALPHA = 4, 2  # scale 0.5: a file read without its scale is off by 2x
TOP_LAYERS = {"x_embedder", "context_embedder", "norm_out.linear", "proj_out",
              *(f"time_text_embed.{kind}_embedder.linear_{index}" for kind in ("timestep", "guidance", "text")
                for index in (1, 2))}  # fmt: skip
# The single blocks' to_q/to_k/to_v/proj_mlp, fused into BFL's linear1.
LINEAR1_PARTS = ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")


@pytest.fixture(scope="module")
def model():
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    return FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2,
                                  attention_head_dim=32, num_attention_heads=2, joint_attention_dim=32,
                                  pooled_projection_dim=32, guidance_embeds=True, axes_dims_rope=(4, 14, 14)).eval()


def trained(model, targets, seed=0) -> LoRAWeights:
    """A peft LoRA of rank 4, alpha 2 on ``targets`` with random (trained-looking) factors, as the trainer saves it."""
    adapted = random_lora_model(model, targets, RANK, ALPHA, seed)
    return from_peft_state_dict({k: v for k, v in adapted.named_parameters() if ".lora_" in k}, ALPHA)


@pytest.fixture(scope="module")
def every_layer(model):
    return trained(model, lora_layer_names(model))


def write(path, weights, layout, model):
    return write_lora(path, weights, layout, naming_for(model))


def diffusers_deltas(model, path):
    """What diffusers' real FluxPipeline.load_lora_weights puts on each module, and its messages."""
    from diffusers import FluxPipeline

    from tests.conftest import load_lora_into_diffusers

    pipe = FluxPipeline(scheduler=None, vae=None, text_encoder=None, tokenizer=None, text_encoder_2=None,
                        tokenizer_2=None, transformer=copy.deepcopy(model))
    messages = load_lora_into_diffusers(pipe, path, "trained")
    deltas = {name: (module.scaling["trained"] * module.lora_B["trained"].weight @ module.lora_A["trained"].weight)
              for name, module in pipe.transformer.named_modules() if hasattr(module, "scaling")}
    return {name: delta.detach() for name, delta in deltas.items()}, messages, pipe


def strengths(inspection):
    return {result.tool: (result.mapped, result.total, None if result.strength is None else round(result.strength, 3))
            for result in inspection.results}


@pytest.mark.fast  # the pipeline holds only the transformer and renders nothing
def test_diffusers_loads_the_universal_file_and_merges_what_this_project_merges(model, every_layer, tmp_path):
    path = write(tmp_path / "lora.safetensors", every_layer, "universal", model)
    deltas, messages, pipe = diffusers_deltas(model, path)
    assert not [m for m in messages if "transformer" in m and ("missing" in m or "unexpected" in m or "No LoRA" in m)]
    assert deltas.keys() == every_layer.layers.keys()  # all 50, the embedders and the final layer included
    for name, delta in deltas.items():
        torch.testing.assert_close(delta, every_layer.layers[name].delta())
    pipe.fuse_lora(lora_scale=1.0)
    ours = copy.deepcopy(model)
    assert load_lora(ours, path) == 50
    fused = {name.replace(".base_layer", ""): value for name, value in pipe.transformer.state_dict().items()
             if ".lora_" not in name}
    assert fused.keys() == ours.state_dict().keys()
    for name, value in ours.state_dict().items():
        torch.testing.assert_close(fused[name], value, rtol=0, atol=1e-6)


@pytest.mark.fast
def test_diffusers_loads_the_kohya_file_s_block_layers(model, tmp_path):
    # Its converter hard-codes the released widths for linear1 (below) and names the embedders and the final layer
    # without transformer., so load_lora_weights drops them: the emulation says the same.
    targets = [name for name in lora_layer_names(model)
               if not (name.startswith("single_transformer_blocks.") and name.endswith(LINEAR1_PARTS))]
    weights = trained(model, targets)
    path = write(tmp_path / "kohya.safetensors", weights, "kohya", model)
    deltas, _, _ = diffusers_deltas(model, path)
    assert deltas.keys() == set(weights.layers) - TOP_LAYERS and len(deltas) == 2 * 14 + 2 * 2
    for name, delta in deltas.items():
        torch.testing.assert_close(delta, weights.layers[name].delta())
    emulated = inspect_lora(path, model).result("diffusers")
    assert (emulated.mapped, emulated.total) == (len(deltas), len(weights.layers))
    assert emulated.strength == pytest.approx(1.0)


def released_width_single_block(proj_mlp=True) -> LoRAWeights:
    """LoRAs on one single block's to_q/to_k/to_v (and proj_mlp) of FLUX.1's released widths (3072, MLP 12288)."""
    generator = torch.Generator().manual_seed(1)
    layers = {}
    for part, rows in zip(LINEAR1_PARTS, (3072, 3072, 3072, 12288)):
        if part != "proj_mlp" or proj_mlp:
            layers[f"single_transformer_blocks.0.{part}"] = LoRALayer(
                torch.randn(2, 3072, generator=generator), torch.randn(rows, 2, generator=generator), 0.5)
    return LoRAWeights(layers)


@pytest.mark.parametrize("proj_mlp", [True, False])
def test_diffusers_kohya_converter_splits_linear1_back_into_the_trained_projections(tmp_path, proj_mlp):
    from diffusers.loaders.lora_pipeline import FluxLoraLoaderMixin

    weights = released_width_single_block(proj_mlp)
    path = write_lora(tmp_path / "linear1.safetensors", weights, "kohya", naming_for("FluxTransformer2DModel"))
    converted = FluxLoraLoaderMixin.lora_state_dict(str(path))
    for part in LINEAR1_PARTS:
        key = f"transformer.single_transformer_blocks.0.{part}"
        down, up = converted[f"{key}.lora_A.weight"], converted[f"{key}.lora_B.weight"]
        assert down.shape[0] == 2  # the block-diagonal fused LoRA splits back into rank-2 parts
        trained_layer = weights.layers.get(key.removeprefix("transformer."))
        want = torch.zeros_like(up @ down) if trained_layer is None else trained_layer.delta()
        torch.testing.assert_close(up @ down, want)
    # This reader leaves the zero block of a proj_mlp not trained out again.
    assert read_lora(path, naming=naming_for("FluxTransformer2DModel")).layers.keys() == weights.layers.keys()


def test_the_fused_kohya_file_reads_back_as_the_trained_projections(model, tmp_path):
    weights = trained(model, [name for name in lora_layer_names(model) if not name.endswith("proj_mlp")])
    path = write(tmp_path / "kohya.safetensors", weights, "kohya", model)
    with safe_open(str(path), "pt") as handle:
        keys = set(handle.keys())
        fused_up = handle.get_tensor("lora_unet_single_blocks_0_linear1.lora_up.weight")
    assert "lora_unet_double_blocks_1_img_attn_qkv.lora_down.weight" in keys and not [k for k in keys if "alpha" in k]
    assert fused_up.shape == (7 * 64, 4 * RANK)  # q, k, v and the zero block of the proj_mlp not trained
    for module_names in (lora_layer_names(model), None):
        back = read_lora(path, module_names, naming_for(model))
        assert back.layout == "kohya" and back.layers.keys() == weights.layers.keys()
        for name, layer in weights.layers.items():
            assert back.layers[name].rank == RANK and back.layers[name].scale == pytest.approx(0.5)
            torch.testing.assert_close(back.layers[name].delta(), layer.delta())
            torch.testing.assert_close(back.layers[name].up, layer.up)  # the trained factors, unfolded


# BFL layer, diffusers layers, rows of each (64 wide), halves swapped: written out here, not taken from the naming.
FUSED_CASES = (
    ("double_blocks.0.img_attn.qkv", [f"transformer_blocks.0.attn.to_{axis}" for axis in "qkv"], [64] * 3, False),
    ("double_blocks.1.txt_attn.qkv", [f"transformer_blocks.1.attn.add_{axis}_proj" for axis in "qkv"], [64] * 3,
     False),
    ("single_blocks.1.linear1", [f"single_transformer_blocks.1.{part}" for part in LINEAR1_PARTS], [64] * 3 + [256],
     False),
    ("double_blocks.0.img_mlp.0", ["transformer_blocks.0.ff.net.0.proj"], [256], False),
    ("final_layer.adaLN_modulation.1", ["norm_out.linear"], [128], True),
)


def shared_down_file(path, alpha, dotted=False):
    """A LoRA trained on BFL's fused layers (as civitai files are): one rank-4 down per fused layer."""
    generator = torch.Generator().manual_seed(2)
    tensors, expected = {}, {}
    for native, names, rows, swapped in FUSED_CASES:
        down, up = torch.randn(RANK, 64, generator=generator), torch.randn(sum(rows), RANK, generator=generator)
        stem = f"diffusion_model.{native}" if dotted else "lora_unet_" + native.replace(".", "_")
        parts = ("lora_A", "lora_B") if dotted else ("lora_down", "lora_up")
        tensors.update({f"{stem}.{parts[0]}.weight": down, f"{stem}.{parts[1]}.weight": up,
                        f"{stem}.alpha": torch.tensor(float(alpha))})
        if swapped:  # BFL's final modulation yields shift, scale; diffusers' norm_out scale, shift
            up = torch.cat([up[64:], up[:64]])
        for name, rows_of_part in zip(names, up.split(rows)):
            expected[name] = alpha / RANK * rows_of_part @ down
    save_file(tensors, str(path))
    return path, expected


@pytest.mark.parametrize("dotted", [False, True])
def test_a_fused_layer_trained_with_one_down_splits_into_each_projection(model, tmp_path, dotted):
    path, expected = shared_down_file(tmp_path / "civitai.safetensors", alpha=8, dotted=dotted)
    back = read_lora(path, lora_layer_names(model), naming_for(model))
    assert back.layers.keys() == expected.keys()
    for name, delta in expected.items():
        assert back.layers[name].rank == RANK  # each projection gets the down and its rows of the up
        torch.testing.assert_close(back.layers[name].delta(), delta)
    found = strengths(inspect_lora(path, model))
    assert found["ComfyUI"] == found["diffsynth"] == (12, 12, 1.0)
    if not dotted:
        assert found["musubi-tuner"] == (11, 12, 1.0)  # no final layer in its blocks
        # DiffSynth-Studio renames no final layer; it scales every layer by the first alpha / rank (2), and on its
        # second conversion by the final layer's (2, already multiplied by sqrt 2) again.
        assert found["DiffSynth-Studio"] == (11, 12, round(2 * math.sqrt(2), 3))


def test_a_fused_layer_that_does_not_fit_is_refused_with_the_file_named(model, tmp_path):
    bad = tmp_path / "bad.safetensors"
    save_file({"lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight": torch.ones(2, 64),
               "lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight": torch.ones(100, 2)}, str(bad))
    with pytest.raises(ValueError, match=rf"{bad}.*img_attn.qkv.*has 100 rows.*have 192 when 64 wide"):
        read_lora(bad, lora_layer_names(model), naming_for(model))


def test_every_tool_maps_the_block_layers_of_both_files_at_strength_one(model, every_layer, tmp_path):
    blocks = LoRAWeights({name: layer for name, layer in every_layer.layers.items() if name not in TOP_LAYERS})
    for layout in ("universal", "kohya"):
        inspection = inspect_lora(write(tmp_path / f"{layout}.safetensors", blocks, layout, model), model)
        found = strengths(inspection)
        readers = ("diffsynth", "ComfyUI", "DiffSynth-Studio") + (("diffusers",) if layout == "universal" else
                                                                   ("musubi-tuner",))
        assert all(found[tool] == (40, 40, 1.0) for tool in readers), inspection.format()
    # The tiny model's linear1 is not 3072 + 3072 + 3072 + 12288 rows: diffusers' kohya converter fails on it.
    assert "AssertionError" in inspection.result("diffusers").error


def test_diffsynth_studio_takes_no_embedder_or_final_layer_and_comfyui_takes_all(model, every_layer, tmp_path):
    for layout in ("universal", "kohya"):
        inspection = inspect_lora(write(tmp_path / f"{layout}.safetensors", every_layer, layout, model), model)
        found = strengths(inspection)
        assert found["ComfyUI"] == found["diffsynth"] == (50, 50, 1.0), inspection.format()
        # Its FluxLoRALoader renames only block layers; its FluxDiT names the others differently.
        assert found["DiffSynth-Studio"] == (40, 50, 1.0)
    assert not inspection.failing(("diffsynth", "ComfyUI"))


def test_diffsynth_studio_scales_every_layer_by_the_first_alpha_it_finds(model, every_layer, tmp_path):
    # A kohya file with alphas (scale 0.5) and an embedder its loader does not rename: it takes the first alpha for
    # every layer, and on its second conversion the embedder's alpha (already scaled by sqrt 0.5) once more. The
    # trainer's kohya files fold the scale and carry no alpha, which it then reads at 1.0 (above).
    from diffsynth.lora.formats import fuse_layers

    tensors = {}
    for native, layer in fuse_layers(every_layer.layers, FLUX1_BFL_NAMING).items():
        stem = "lora_unet_" + native.replace(".", "_")
        tensors.update({f"{stem}.lora_down.weight": layer.down.detach().contiguous(),
                        f"{stem}.lora_up.weight": layer.up.detach().contiguous(),
                        f"{stem}.alpha": torch.tensor(float(layer.scale * layer.rank))})
    save_file(tensors, str(tmp_path / "alphas.safetensors"))
    found = strengths(inspect_lora(tmp_path / "alphas.safetensors", model))
    assert found["ComfyUI"] == (50, 50, 1.0)
    assert found["DiffSynth-Studio"] == (40, 50, round(0.5 * math.sqrt(0.5), 3))
