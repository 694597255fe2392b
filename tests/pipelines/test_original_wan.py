"""The original Wan release layouts load into the diffusers / transformers classes, equal to their diffusers twins."""

import json
import shutil

import pytest
import torch
from accelerate import init_empty_weights

from diffsynth.core.loader import ModelConfig, ModelLoadError, load_model, load_skeleton, load_tokenizer, resolve
from diffsynth.core.loader.loading import model_class_name
from diffsynth.pipelines.wan_video.original import (dit_config, dit_model_keys, dit_original_config, dit_original_keys,
                                                    original_dit_config_json)
from diffsynth.pipelines.wan_video.original_encoders import (clip_config, clip_model_keys, clip_original_state_dict,
                                                         umt5_config, umt5_model_keys, umt5_original_state_dict)
from diffsynth.pipelines.wan_video.original_vae import (WAN22_LATENTS_MEAN, vae_config, vae_original_keys,
                                                    wan21_vae_model_keys, wan22_vae_model_keys)
from diffsynth.testing import tiny_wan as tiny
from tests.pipelines.family_helpers import assert_same_model

ORIGINAL, DIFFUSERS = tiny.WAN_ORIGINAL_MODEL_ID, tiny.WAN_MODEL_ID
I2V_ORIGINAL, I2V_DIFFUSERS = tiny.WAN_I2V_ORIGINAL_MODEL_ID, tiny.WAN_I2V_MODEL_ID


def load(model_id, pattern):
    return load_model(ModelConfig(model_id=model_id, origin_file_pattern=pattern), torch.float32)


def assert_same_output(actual: torch.Tensor, expected: torch.Tensor) -> None:
    # Equal weights in differently aligned buffers may take other vectorised kernels: last-bit differences only.
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)


# ---- each original file equals its diffusers twin, in weights and in outputs ---------------------------------------


def test_the_original_dit_equals_the_diffusers_transformer(base):
    for (original, pattern), (twin, twin_pattern) in (
        ((ORIGINAL, tiny.WAN_ORIGINAL_PATTERNS["dit"]), (DIFFUSERS, tiny.WAN_PATTERNS["dit"])),
        ((I2V_ORIGINAL, tiny.WAN_I2V_ORIGINAL_PATTERNS["dit"]), (I2V_DIFFUSERS, tiny.WAN_I2V_PATTERNS["dit"])),
    ):
        dit, expected = load(original, pattern), load(twin, twin_pattern)
        assert_same_model(dit, expected)
        channels = dit.config.in_channels
        inputs = dict(hidden_states=torch.randn(1, channels, 2, 8, 8), timestep=torch.tensor([500.0]),
                      encoder_hidden_states=torch.randn(1, 7, tiny.TEXT_DIM), return_dict=False)
        if dit.config.image_dim:
            inputs["encoder_hidden_states_image"] = torch.randn(1, 17, dit.config.image_dim)
        assert_same_output(dit(**inputs)[0], expected(**inputs)[0])


@pytest.mark.parametrize(("model_id", "patterns", "twin"), [
    (tiny.WAN22_T2V_MODEL_ID, tiny.WAN22_A14B_PATTERNS, {"dit": (4, 16, 16), "dit2": (5, 16, 16)}),
    (tiny.WAN22_I2V_MODEL_ID, tiny.WAN22_A14B_PATTERNS, {"dit": (6, 36, 16), "dit2": (7, 36, 16)}),
    (tiny.WAN22_TI2V_MODEL_ID, tiny.WAN22_TI2V_PATTERNS, {"dit": (8, 48, 48)}),
])  # fmt: skip
def test_the_wan22_transformers_equal_their_diffusers_twins(base, model_id, patterns, twin):
    for name, (offset, in_channels, out_channels) in twin.items():
        expected = tiny.tiny_wan_transformer(0, offset, in_channels=in_channels, out_channels=out_channels)
        assert_same_model(load(model_id, patterns[name]), expected.eval())


def test_the_t5_file_equals_the_umt5_encoder(base):
    encoder = load(ORIGINAL, tiny.WAN_ORIGINAL_PATTERNS["text_encoder"])
    expected = load(DIFFUSERS, tiny.WAN_PATTERNS["text_encoder"])
    assert_same_model(encoder, expected)
    assert encoder.encoder.embed_tokens.weight is encoder.shared.weight  # tied, as from_pretrained ties them
    ids = torch.tensor([[5, 9, 17, 3, 1, 0, 0]])
    mask = (ids != 0).long()
    assert_same_output(encoder(ids, mask).last_hidden_state, expected(ids, mask).last_hidden_state)


def test_the_tokenizer_in_google_umt5_xxl_loads(base):
    tokenizer = load_tokenizer(ModelConfig(model_id=ORIGINAL, origin_file_pattern="google/umt5-xxl/"))
    expected = load_tokenizer(ModelConfig(model_id=DIFFUSERS, origin_file_pattern="tokenizer/"))
    assert tokenizer("a red cat").input_ids == expected("a red cat").input_ids


def test_the_vae_files_equal_autoencoder_kl_wan(base):
    pairs = (
        (load(ORIGINAL, "Wan2.1_VAE.pth"), load(DIFFUSERS, tiny.WAN_PATTERNS["vae"]), 8, 16),
        (load(tiny.WAN22_TI2V_MODEL_ID, "Wan2.2_VAE.pth"), tiny.tiny_wan22_vae(0).eval(), 16, 48),
    )
    for vae, expected, spatial, channels in pairs:
        assert_same_model(vae, expected)
        video = torch.rand(1, 3, 5, 32, 32) * 2 - 1
        latents = vae.encode(video).latent_dist.mode()
        assert latents.shape == (1, channels, 2, 32 // spatial, 32 // spatial)
        assert_same_output(latents, expected.encode(video).latent_dist.mode())
        assert_same_output(vae.decode(latents).sample, expected.decode(latents).sample)


def test_the_clip_file_equals_the_clip_vision_tower(base):
    encoder = load(I2V_ORIGINAL, tiny.WAN_I2V_ORIGINAL_PATTERNS["image_encoder"])
    expected = load(I2V_DIFFUSERS, tiny.WAN_I2V_PATTERNS["image_encoder"])
    assert_same_model(encoder, expected)
    pixels = torch.randn(1, 3, tiny.TINY_CLIP_IMAGE_SIZE, tiny.TINY_CLIP_IMAGE_SIZE)
    ours = encoder(pixel_values=pixels, output_hidden_states=True).hidden_states[-2]
    assert_same_output(ours, expected(pixel_values=pixels, output_hidden_states=True).hidden_states[-2])


def test_class_names_and_skeletons_come_from_the_files(base):
    expected = {tiny.WAN_ORIGINAL_PATTERNS["dit"]: "WanTransformer3DModel", "Wan2.1_VAE.pth": "AutoencoderKLWan",
                "models_t5_umt5-xxl-enc-bf16.pth": "UMT5EncoderModel", "google/umt5-xxl/": None}
    for pattern, name in expected.items():
        assert model_class_name(ModelConfig(model_id=ORIGINAL, origin_file_pattern=pattern)) == name
    skeleton = load_skeleton(ModelConfig(model_id=I2V_ORIGINAL, origin_file_pattern="models_clip_*.pth"))
    assert type(skeleton).__name__ == "CLIPVisionModel" and all(p.is_meta for p in skeleton.parameters())


# ---- the name maps against the released structures (built on the meta device) --------------------------------------

# The released transformer configs (diffusers' scripts/convert_wan_to_diffusers.py) and their original config.json.
RELEASED_DITS = {
    "t2v-1.3B": ("t2v", dict(num_attention_heads=12, ffn_dim=8960, num_layers=30, in_channels=16, out_channels=16)),
    "i2v-14B": ("i2v", dict(num_attention_heads=40, ffn_dim=13824, num_layers=40, in_channels=36, out_channels=16,
                            image_dim=1280, added_kv_proj_dim=5120)),
    "ti2v-5B": ("ti2v", dict(num_attention_heads=24, ffn_dim=14336, num_layers=30, in_channels=48, out_channels=48)),
    "flf2v-14B": ("flf2v", dict(num_attention_heads=40, ffn_dim=13824, num_layers=40, in_channels=36, out_channels=16,
                                image_dim=1280, added_kv_proj_dim=5120, pos_embed_seq_len=514)),
}


@pytest.mark.parametrize("name", RELEASED_DITS)
def test_the_dit_maps_are_inverse_and_read_the_released_configs(name):
    from diffusers import WanTransformer3DModel

    model_type, sizes = RELEASED_DITS[name]
    config = dict(patch_size=[1, 2, 2], attention_head_dim=128, text_dim=4096, freq_dim=256, eps=1e-6,
                  cross_attn_norm=True, qk_norm="rms_norm_across_heads", image_dim=None, added_kv_proj_dim=None)
    config.update(sizes)
    with init_empty_weights():
        model = WanTransformer3DModel(**config)
    shapes = {key: tuple(t.shape) for key, t in model.state_dict().items()}
    original = dit_original_keys(list(shapes))
    assert len(set(original.values())) == len(original)
    # diffusers' own converter takes the original names back to the model's
    assert dit_model_keys(list(original.values())) == {key: name for key, name in original.items()}
    inferred = dit_config(original_dit_config_json(config, model_type), {original[k]: s for k, s in shapes.items()},
                          None)
    assert {key: inferred[key] for key in config} == config
    assert dit_original_config(model)["model_type"] == model_type  # what a full fine-tune's original folder says


RELEASED_VAES = {
    "Wan2.1_VAE": {},  # AutoencoderKLWan's defaults are the Wan2.1 VAE
    "Wan2.2_VAE": dict(base_dim=160, decoder_base_dim=256, z_dim=48, is_residual=True, in_channels=12,
                       out_channels=12, patch_size=2, scale_factor_spatial=16),
}


@pytest.mark.parametrize("name", RELEASED_VAES)
def test_the_vae_maps_are_inverse_and_read_the_released_configs(name):
    from diffusers import AutoencoderKLWan

    with init_empty_weights():
        vae = AutoencoderKLWan(**RELEASED_VAES[name])
    shapes = {key: tuple(t.shape) for key, t in vae.state_dict().items()}
    original = vae_original_keys(list(shapes), dict(vae.config))
    assert len(set(original.values())) == len(original)
    forward = wan22_vae_model_keys if vae.config.is_residual else wan21_vae_model_keys  # Wan2.1: diffusers' converter
    assert forward(list(original.values())) == original
    inferred = vae_config({original[k]: s for k, s in shapes.items()}, name)
    if name == "Wan2.2_VAE":  # the released statistics, which diffusers' class does not default to
        assert inferred["latents_mean"] == WAN22_LATENTS_MEAN
        vae.register_to_config(latents_mean=inferred["latents_mean"], latents_std=inferred["latents_std"])
    assert {key: vae.config[key] for key in inferred} == inferred


def test_the_encoder_maps_read_the_released_sizes():
    from transformers import CLIPVisionConfig, CLIPVisionModel, UMT5Config, UMT5EncoderModel

    umt5_xxl = dict(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                    relative_attention_num_buckets=32)  # google/umt5-xxl
    with init_empty_weights():
        text = UMT5EncoderModel(UMT5Config(**umt5_xxl))
        vision = CLIPVisionModel(CLIPVisionConfig(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
                                                  num_attention_heads=16, image_size=224, patch_size=14))
    for model, to_original, to_model, read_config, expected in (
        (text, umt5_original_state_dict, umt5_model_keys, umt5_config, umt5_xxl),
        (vision, clip_original_state_dict, clip_model_keys, clip_config,
         dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, image_size=224, patch_size=14)),
    ):
        state = dict(model.state_dict())
        original = to_original(state)
        shapes = {key: tuple(t.shape) for key, t in original.items()}
        assert {key for key in to_model(list(original))} | {"encoder.embed_tokens.weight"} >= set(state)
        assert {key: value for key, value in read_config(shapes, "file").items() if key in expected} == expected


# ---- bad inputs fail with the file's name and the fix --------------------------------------------------------------


def test_an_unknown_pth_names_the_file_and_the_known_ones(scratch_base):
    folder = scratch_base.root / "Someone/Model"
    folder.mkdir(parents=True)
    torch.save({"encoder.layer.0.weight": torch.ones(2)}, folder / "weights.pth")
    with pytest.raises(ModelLoadError, match=r"weights\.pth is not an original Wan release file.*Wan2\.1_VAE\.pth"):
        load_model(ModelConfig(model_id="Someone/Model", origin_file_pattern="weights.pth"))


def test_a_pth_among_other_files_is_refused(scratch_base):
    folder = scratch_base.root / ORIGINAL
    folder.mkdir(parents=True)
    torch.save({"a": torch.ones(1)}, folder / "a.pth")
    torch.save({"b": torch.ones(1)}, folder / "b.pth")
    with pytest.raises(ModelLoadError, match="give each one its own entry"):
        load_model(ModelConfig(model_id=ORIGINAL, origin_file_pattern="*.pth"))


def test_a_config_naming_an_unknown_class_names_the_file(base, tmp_path, monkeypatch):
    repo = tmp_path / ORIGINAL
    shutil.copytree(base / ORIGINAL, repo)
    config = json.loads((repo / "config.json").read_text())
    (repo / "config.json").write_text(json.dumps({**config, "_class_name": "WanModelV9"}))
    monkeypatch.setenv(resolve.BASE_PATH_ENV, str(tmp_path))
    with pytest.raises(ModelLoadError, match=r"config\.json names diffusers class 'WanModelV9'.*check the class name"):
        load_model(ModelConfig(model_id=ORIGINAL, origin_file_pattern=tiny.WAN_ORIGINAL_PATTERNS["dit"]))
