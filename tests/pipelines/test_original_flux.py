"""FLUX.1's single files (BFL's transformer layout, the LDM-layout ``ae.safetensors``) load into diffusers' classes:
round trips through the inverse maps, agreement with diffusers' own single-file converters at the released widths,
and errors that name the file."""

import pytest
import torch
from accelerate import init_empty_weights
from safetensors import safe_open
from safetensors.torch import save_file

from diffsynth.core.loader import ModelConfig, ModelLoadError, load_model, load_model_from_files, load_skeleton
from diffsynth.core.loader.loading import model_class_name
from diffsynth.pipelines.flux.original import (
    FLUX1_VAE_CONFIG,
    identify,
    transformer_config,
    transformer_sources,
    transformer_to_original,
    vae_config,
    vae_sources,
    vae_to_original,
)
from tests.pipelines.family_helpers import assert_same_model, public_config

# black-forest-labs/FLUX.1-dev's transformer/config.json and vae/config.json (sizes; the rest is FLUX1_VAE_CONFIG).
RELEASED_TRANSFORMER = {
    "patch_size": 1, "in_channels": 64, "out_channels": None, "num_layers": 19, "num_single_layers": 38,
    "attention_head_dim": 128, "num_attention_heads": 24, "joint_attention_dim": 4096, "pooled_projection_dim": 768,
    "guidance_embeds": True, "axes_dims_rope": [16, 56, 56],
}  # fmt: skip
RELEASED_VAE = {
    "in_channels": 3, "out_channels": 3, "latent_channels": 16, "block_out_channels": [128, 256, 512, 512],
    "layers_per_block": 2, "down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4,
}  # fmt: skip


def tiny_transformer(guidance: bool, double: int = 2, single: int = 2):
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    return FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=double, num_single_layers=single, attention_head_dim=32,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=24, guidance_embeds=guidance,
        axes_dims_rope=(4, 14, 14),
    ).eval()  # fmt: skip


def tiny_vae(widths=(32, 32, 64, 64), layers: int = 1):
    from diffusers import AutoencoderKL

    torch.manual_seed(1)
    stages = len(widths)
    return AutoencoderKL(
        **FLUX1_VAE_CONFIG, in_channels=3, out_channels=3, latent_channels=16, block_out_channels=widths,
        layers_per_block=layers, down_block_types=("DownEncoderBlock2D",) * stages,
        up_block_types=("UpDecoderBlock2D",) * stages,
    ).eval()  # fmt: skip


def save(state_dict: dict, path):
    save_file({key: tensor.contiguous() for key, tensor in state_dict.items()}, str(path))
    return path


def transformer_inputs(model, tokens: int = 16, words: int = 7) -> dict:
    config = model.config
    torch.manual_seed(2)
    positions = torch.meshgrid(torch.zeros(1), torch.arange(4.0), torch.arange(4.0), indexing="ij")
    inputs = {
        "hidden_states": torch.randn(1, tokens, config.in_channels),
        "encoder_hidden_states": torch.randn(1, words, config.joint_attention_dim),
        "pooled_projections": torch.randn(1, config.pooled_projection_dim), "timestep": torch.tensor([0.7]),
        "img_ids": torch.stack(positions, dim=-1).reshape(tokens, 3), "txt_ids": torch.zeros(words, 3),
        "return_dict": False,
    }  # fmt: skip
    if config.guidance_embeds:
        inputs["guidance"] = torch.tensor([3.5])
    return inputs


# ---- round trips through the real loader ----------------------------------------------------------------------------


@pytest.mark.parametrize("guidance", [True, False])
def test_a_bfl_transformer_file_loads_as_the_model_it_was_written_from(tmp_path, guidance):
    expected = tiny_transformer(guidance, double=2, single=1 if guidance else 2)
    file = save(transformer_to_original(expected.state_dict()), tmp_path / "flux1-dev.safetensors")
    with safe_open(str(file), "pt") as handle:
        keys = set(handle.keys())
    assert "double_blocks.0.img_attn.qkv.weight" in keys and "single_blocks.0.linear1.weight" in keys
    assert ("guidance_in.in_layer.weight" in keys) is guidance
    model = load_model(ModelConfig(path=str(file)), torch.float32)
    assert_same_model(model, expected)
    with torch.no_grad():
        torch.testing.assert_close(model(**transformer_inputs(model))[0],
                                   expected(**transformer_inputs(expected))[0], rtol=1e-5, atol=1e-6)


def test_an_ae_file_loads_as_the_vae_it_was_written_from(tmp_path):
    expected = tiny_vae()
    file = save(vae_to_original(expected.state_dict()), tmp_path / "ae.safetensors")
    with safe_open(str(file), "pt") as handle:
        assert handle.get_slice("encoder.mid.attn_1.q.weight").get_shape() == [64, 64, 1, 1]
    vae = load_model_from_files([file], torch.float32)
    assert_same_model(vae, expected)
    image = torch.rand(1, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        latents = vae.encode(image).latent_dist.mode()
        assert latents.shape == (1, 16, 4, 4)
        torch.testing.assert_close(latents, expected.encode(image).latent_dist.mode(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(vae.decode(latents).sample, expected.decode(latents).sample, rtol=1e-5, atol=1e-6)


def test_class_names_and_skeletons_come_from_the_files(tmp_path):
    transformer = save(transformer_to_original(tiny_transformer(True).state_dict()), tmp_path / "flux1-dev.safetensors")
    vae = save(vae_to_original(tiny_vae().state_dict()), tmp_path / "ae.safetensors")
    assert model_class_name(ModelConfig(path=str(transformer))) == "FluxTransformer2DModel"
    assert model_class_name(ModelConfig(path=str(vae))) == "AutoencoderKL"
    skeleton = load_skeleton(ModelConfig(path=str(transformer)))
    assert type(skeleton).__name__ == "FluxTransformer2DModel" and all(p.is_meta for p in skeleton.parameters())


def test_the_split_projections_load_in_bfloat16_each_in_its_own_memory(tmp_path):
    expected = tiny_transformer(True)
    file = save(transformer_to_original(expected.state_dict()), tmp_path / "flux1-dev.safetensors")
    model = load_model_from_files([file], torch.bfloat16)
    q = model.transformer_blocks[0].attn.to_q.weight
    assert q.dtype == torch.bfloat16 and torch.equal(q, expected.transformer_blocks[0].attn.to_q.weight.bfloat16())
    # each part owns its storage: a view would keep the whole fused qkv tensor alive behind it
    assert q.untyped_storage().nbytes() == q.numel() * q.element_size()


def test_diffusers_files_are_not_taken_for_bfl_ones(tmp_path):
    tiny_vae().save_pretrained(tmp_path / "vae")
    assert identify([tmp_path / "vae" / "diffusion_pytorch_model.safetensors"]) is None
    # FLUX.2's BFL layout also has double_blocks, but no per-block modulation
    flux2 = save({"double_blocks.0.img_attn.qkv.weight": torch.zeros(6, 2),
                  "double_stream_modulation_img.lin.weight": torch.zeros(12, 2)}, tmp_path / "flux2.safetensors")
    assert identify([flux2]) is None


def test_a_diffusers_folder_with_ldm_like_names_is_not_taken_for_an_ae_file(tmp_path):
    from diffusers import AutoencoderKLLTX2Audio

    # LTX-2's audio VAE keeps the LDM block names (encoder.down.0.block.0.*) in a diffusers folder.
    vae = AutoencoderKLLTX2Audio(base_channels=8, ch_mult=(1,), num_res_blocks=1, latent_channels=8, mel_bins=4)
    vae.save_pretrained(tmp_path / "audio_vae")
    file = tmp_path / "audio_vae" / "diffusion_pytorch_model.safetensors"
    assert any(key.startswith("encoder.down.0.block.0.") for key in safe_open(str(file), "pt").keys())
    assert identify([file]) is None


# ---- the maps against diffusers' own converters ---------------------------------------------------------------------


def row_coded(shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """A stand-in checkpoint with these shapes' rows and one column: each tensor's values are its key's number times
    2**15 plus the row, so a tensor taken from the wrong key or rows shows. diffusers' converter splits and swaps
    rows only, so one column tells what every column would."""
    coded = {}
    for number, (key, shape) in enumerate(sorted(shapes.items())):
        coded[key] = (torch.arange(shape[0], dtype=torch.int32) + number * 2**15).view(-1, *[1] * (len(shape) - 1))
    return coded


def test_the_transformer_map_agrees_with_diffusers_converter_at_the_released_widths():
    """diffusers' converter splits the fused projections at the released width (3072, MLP 12288), so it is the
    reference there: one double and one single block of the released shapes, on the meta device for the shapes and
    row-coded (``row_coded``) for which rows land where."""
    from diffusers import FluxTransformer2DModel
    from diffusers.loaders.single_file_utils import convert_flux_transformer_checkpoint_to_diffusers

    with init_empty_weights():
        model = FluxTransformer2DModel(**{**RELEASED_TRANSFORMER, "num_layers": 1, "num_single_layers": 1})
    model_shapes = {key: tuple(tensor.shape) for key, tensor in model.state_dict().items()}
    meta = transformer_to_original(model.state_dict())
    shapes = {key: tuple(tensor.shape) for key, tensor in meta.items()}
    assert shapes["double_blocks.0.img_attn.qkv.weight"] == (3 * 3072, 3072)
    assert shapes["single_blocks.0.linear1.weight"] == (3 * 3072 + 12288, 3072)
    coded = row_coded(shapes)
    converted_meta = convert_flux_transformer_checkpoint_to_diffusers(dict(meta))
    their_shapes = {key: tuple(tensor.shape) for key, tensor in converted_meta.items()}
    theirs = convert_flux_transformer_checkpoint_to_diffusers(dict(coded))
    config = transformer_config(shapes, "flux1-dev.safetensors")
    assert config == {**RELEASED_TRANSFORMER, "num_layers": 1, "num_single_layers": 1}
    sources = transformer_sources(shapes, config, "flux1-dev.safetensors")
    assert sources.keys() == theirs.keys() == model_shapes.keys()
    for model_key, (key, convert) in sources.items():
        convert = convert or (lambda tensor: tensor)
        assert tuple(convert(meta[key]).shape) == their_shapes[model_key] == model_shapes[model_key], model_key
        assert torch.equal(convert(coded[key]), theirs[model_key]), model_key


def test_the_vae_map_agrees_with_diffusers_converter_at_other_sizes():
    """diffusers' LDM converter assumes no widths; three stages of two blocks differ from the release."""
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    vae = tiny_vae(widths=(32, 64, 64), layers=2)
    checkpoint = vae_to_original(vae.state_dict())
    shapes = {key: tuple(tensor.shape) for key, tensor in checkpoint.items()}
    config = vae_config(shapes, "ae.safetensors")
    assert {key: public_config(vae)[key] for key in config} == config
    theirs = convert_ldm_vae_checkpoint(dict(checkpoint), config)
    sources = vae_sources(shapes, config, "ae.safetensors")
    assert sources.keys() == theirs.keys() == vae.state_dict().keys()
    for model_key, (key, convert) in sources.items():
        ours = checkpoint[key] if convert is None else convert(checkpoint[key])
        assert torch.equal(ours, theirs[model_key]), model_key


def test_the_released_vae_shapes_give_the_released_config():
    from diffusers import AutoencoderKL

    with init_empty_weights():
        vae = AutoencoderKL(**FLUX1_VAE_CONFIG, **RELEASED_VAE)
    shapes = {key: tuple(tensor.shape) for key, tensor in vae_to_original(vae.state_dict()).items()}
    assert "decoder.up.3.block.2.conv1.weight" in shapes and "decoder.up.0.block.0.nin_shortcut.weight" in shapes
    for side in ("encoder", "decoder"):  # BFL's AttnBlock projects with 1x1 convolutions
        assert all(shapes[f"{side}.mid.attn_1.{layer}.weight"] == (512, 512, 1, 1) for layer in ("q", "k", "v",
                                                                                                 "proj_out"))
    assert vae_config(shapes, "ae.safetensors") == {**FLUX1_VAE_CONFIG, **RELEASED_VAE}


@pytest.mark.parametrize(("head_dim", "axes"), [(128, [16, 56, 56]), (64, [8, 28, 28]), (32, [4, 14, 14])])
def test_the_rotary_axes_follow_the_head_dim(head_dim, axes):
    shapes = {key: tuple(t.shape) for key, t in transformer_to_original(tiny_transformer(True).state_dict()).items()}
    shapes["double_blocks.0.img_attn.norm.query_norm.scale"] = (head_dim,)
    shapes["img_in.weight"] = (2 * head_dim, 64)
    config = transformer_config(shapes, "x.safetensors")
    assert config["axes_dims_rope"] == axes and sum(axes) == head_dim and config["num_attention_heads"] == 2


# ---- bad files fail with the file's name -----------------------------------------------------------------------------


def bfl_transformer(tmp_path, drop: tuple[str, ...] = (), add: dict | None = None):
    state = transformer_to_original(tiny_transformer(True).state_dict())
    state = {key: tensor for key, tensor in state.items() if key not in drop}
    return save({**state, **(add or {})}, tmp_path / "flux1-dev.safetensors")


def test_a_transformer_file_missing_block_tensors_names_the_file_and_the_tensors(tmp_path):
    file = bfl_transformer(tmp_path, drop=("double_blocks.1.txt_attn.qkv.bias", "single_blocks.1.linear2.weight"))
    with pytest.raises(ModelLoadError, match=r"flux1-dev\.safetensors lacks 2 tensor\(s\) of a FLUX\.1 transformer "
                                             r"with 2 double and 2 single blocks: 'double_blocks\.1\.txt_attn\.qkv"
                                             r"\.bias', 'single_blocks\.1\.linear2\.weight'.*download it again"):
        load_model(ModelConfig(path=str(file)))


def test_a_transformer_file_missing_a_size_tensor_names_the_file(tmp_path):
    file = bfl_transformer(tmp_path, drop=("img_in.weight",))
    with pytest.raises(ModelLoadError, match=r"flux1-dev\.safetensors lacks 'img_in\.weight'"):
        load_model_from_files([file])


def test_an_unknown_tensor_in_a_transformer_file_is_reported(tmp_path):
    file = bfl_transformer(tmp_path, add={"lora_unet_extra.weight": torch.zeros(2)})
    with pytest.raises(ModelLoadError, match=r"'lora_unet_extra\.weight'.*flux1-dev\.safetensors"):
        load_model_from_files([file])


def test_a_head_dim_the_rotary_axes_cannot_split_is_refused(tmp_path):
    from diffusers import FluxTransformer2DModel

    odd = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                 attention_head_dim=24, num_attention_heads=2, joint_attention_dim=8,
                                 pooled_projection_dim=8, axes_dims_rope=(4, 10, 10))
    file = save(transformer_to_original(odd.state_dict()), tmp_path / "odd.safetensors")
    with pytest.raises(ModelLoadError, match=r"odd\.safetensors: attention head dim 24 .*multiple of 32"):
        load_model_from_files([file])


def test_a_truncated_file_names_the_file(tmp_path):
    file = bfl_transformer(tmp_path)
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"flux1-dev\.safetensors.*download"):
        load_model_from_files([file])


def test_a_vae_file_missing_tensors_names_the_file_and_the_tensors(tmp_path):
    state = vae_to_original(tiny_vae().state_dict())
    del state["decoder.up.0.block.1.conv2.weight"], state["encoder.mid.attn_1.k.weight"]
    file = save(state, tmp_path / "ae.safetensors")
    with pytest.raises(ModelLoadError, match=r"ae\.safetensors lacks 2 tensor\(s\) of a FLUX\.1 VAE with 4 stages: "
                                             r"'decoder\.up\.0\.block\.1\.conv2\.weight', 'encoder\.mid\.attn_1\.k"):
        load_model_from_files([file])


def test_an_ldm_vae_that_is_not_flux1s_is_refused(tmp_path):
    from diffusers import AutoencoderKL

    sd_like = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(32, 32),
                            layers_per_block=1, down_block_types=("DownEncoderBlock2D",) * 2,
                            up_block_types=("UpDecoderBlock2D",) * 2)
    state = {key: tensor for key, tensor in sd_like.state_dict().items() if "quant_conv" not in key}
    original = {**vae_to_original(state), "quant_conv.weight": torch.zeros(8, 8, 1, 1)}
    file = save(original, tmp_path / "sd_vae.safetensors")
    with pytest.raises(ModelLoadError, match=r"sd_vae\.safetensors is an LDM-layout VAE with 4 latent channels and "
                                             r"quant convolutions.*diffusers folder"):
        load_model_from_files([file])


def test_the_inverse_maps_refuse_keys_without_a_counterpart():
    state = dict(tiny_transformer(True).state_dict())
    with pytest.raises(ValueError, match=r"'extra\.weight'.*no counterpart in BFL"):
        transformer_to_original({**state, "extra.weight": torch.zeros(1)})
    del state["transformer_blocks.0.attn.to_k.weight"]
    with pytest.raises(ValueError, match=r"lacks \['transformer_blocks\.0\.attn\.to_k\.weight'\].*img_attn\.qkv"):
        transformer_to_original(state)
    with pytest.raises(ValueError, match=r"'quant_conv\.weight' has no counterpart"):
        vae_to_original({**tiny_vae().state_dict(), "quant_conv.weight": torch.zeros(1)})
