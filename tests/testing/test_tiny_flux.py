"""The tiny FLUX.1 repos: the released layout (BFL's single files beside the diffusers folders, holding the same
weights), shared text encoders and VAE, deterministic, and rendered by diffusers' own ``FluxPipeline`` and
``FluxKontextPipeline``."""

import json

import pytest
import torch
from safetensors import safe_open

from diffsynth.core.loader import ModelConfig, load_model, load_tokenizer
from diffsynth.testing.tiny_flux import (
    CLIP_MAX_LENGTH,
    FLUX1_BUILDERS,
    FLUX1_DEV_MODEL_ID,
    FLUX1_KONTEXT_MODEL_ID,
    FLUX1_KONTEXT_PATTERNS,
    FLUX1_KREA_MODEL_ID,
    FLUX1_KREA_PATTERNS,
    FLUX1_PATTERNS,
    FLUX1_SCHEDULER_CONFIG,
    build_clip_tokenizer,
    build_tiny_flux1,
)
from diffsynth.testing.tiny_models import BUILDERS, main

from tests.pipelines.test_original_flux import assert_same_model

PATTERNS = {FLUX1_DEV_MODEL_ID: FLUX1_PATTERNS, FLUX1_KONTEXT_MODEL_ID: FLUX1_KONTEXT_PATTERNS,
            FLUX1_KREA_MODEL_ID: FLUX1_KREA_PATTERNS}  # fmt: skip
RELEASES = tuple(PATTERNS)


def load(model_id: str, pattern: str):
    return load_model(ModelConfig(model_id=model_id, origin_file_pattern=pattern), torch.float32)


def test_the_builders_are_registered_and_the_cli_builds_them(tmp_path, capsys):
    assert all(BUILDERS[name] is builder for name, builder in FLUX1_BUILDERS.items())
    assert main(["--output", str(tmp_path), "--only", "flux1_dev", "flux1_krea_dev"]) == 0
    assert (tmp_path / FLUX1_DEV_MODEL_ID / "flux1-dev.safetensors").is_file()
    assert "flux1_krea_dev: " in capsys.readouterr().out


@pytest.mark.parametrize("model_id", RELEASES)
def test_repo_has_the_released_layout(tiny_root, model_id):
    repo = tiny_root / model_id
    patterns = PATTERNS[model_id]
    assert (repo / patterns["dit"]).is_file() and (repo / patterns["vae"]).is_file()
    assert not (repo / "config.json").exists()  # the single files stand alone, as in the release
    transformer = sorted(p.name for p in (repo / "transformer").glob("*.safetensors"))
    assert len(transformer) >= 2 and all(n.startswith("diffusion_pytorch_model-0000") for n in transformer)
    index = json.loads((repo / "transformer" / "diffusion_pytorch_model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == transformer
    assert [p.name for p in (repo / "text_encoder").glob("*.safetensors")] == ["model.safetensors"]
    with safe_open(str(repo / "text_encoder" / "model.safetensors"), "pt") as handle:
        keys = list(handle.keys())
    assert all(key.startswith("text_model.") for key in keys)  # the released names
    assert len(list((repo / "text_encoder_2").glob("model-0000*-of-0000*.safetensors"))) >= 2
    assert (repo / "text_encoder_2" / "model.safetensors.index.json").is_file()
    assert [p.name for p in (repo / "vae").glob("*.safetensors")] == ["diffusion_pytorch_model.safetensors"]
    assert json.loads((repo / "scheduler" / "scheduler_config.json").read_text()) == FLUX1_SCHEDULER_CONFIG
    model_index = json.loads((repo / "model_index.json").read_text())
    kontext = model_id == FLUX1_KONTEXT_MODEL_ID
    assert model_index["_class_name"] == ("FluxKontextPipeline" if kontext else "FluxPipeline")
    assert model_index["transformer"] == ["diffusers", "FluxTransformer2DModel"]
    assert model_index["text_encoder"] == ["transformers", "CLIPTextModel"]
    assert model_index["text_encoder_2"] == ["transformers", "T5EncoderModel"]
    assert model_index["tokenizer"] == ["transformers", "CLIPTokenizer"]
    assert model_index["vae"] == ["diffusers", "AutoencoderKL"]
    config = json.loads((repo / "transformer" / "config.json").read_text())
    assert config["guidance_embeds"] is True and config["axes_dims_rope"] == [4, 14, 14]
    assert config["attention_head_dim"] * config["num_attention_heads"] == 64


def test_the_releases_share_text_encoders_and_vae_but_not_the_transformer(tiny_root):
    dev, kontext, krea = (tiny_root / model_id for model_id in RELEASES)
    for shared in ("ae.safetensors", "vae/diffusion_pytorch_model.safetensors", "text_encoder/model.safetensors",
                   "text_encoder_2/model-00001-of-00002.safetensors", "tokenizer/tokenizer.json",
                   "tokenizer_2/tokenizer.json"):
        assert (dev / shared).read_bytes() == (kontext / shared).read_bytes() == (krea / shared).read_bytes()
    files = [tiny_root / model_id / PATTERNS[model_id]["dit"] for model_id in RELEASES]
    assert len({file.read_bytes() for file in files}) == 3


@pytest.mark.parametrize("model_id", RELEASES)
def test_the_single_files_hold_the_diffusers_folders_weights(tiny_root, base, model_id):
    patterns = PATTERNS[model_id]
    assert_same_model(load(model_id, patterns["dit"]), load(model_id, "transformer/*.safetensors"))
    vae = load(model_id, patterns["vae"])
    assert_same_model(vae, load(model_id, "vae/diffusion_pytorch_model.safetensors"))
    assert (vae.config.scaling_factor, vae.config.shift_factor) == (0.3611, 0.1159)


def test_the_text_encoders_and_tokenizers_load_from_the_reference_patterns(base):
    from transformers import CLIPTextModel, T5EncoderModel

    clip = load(FLUX1_DEV_MODEL_ID, FLUX1_PATTERNS["text_encoder"])
    t5 = load(FLUX1_DEV_MODEL_ID, FLUX1_PATTERNS["text_encoder_2"])
    assert isinstance(clip, CLIPTextModel) and isinstance(t5, T5EncoderModel)
    tokenizer, tokenizer_2 = (load_tokenizer(ModelConfig(model_id=FLUX1_DEV_MODEL_ID, origin_file_pattern=pattern))
                              for pattern in (FLUX1_PATTERNS["tokenizer"], FLUX1_PATTERNS["tokenizer_2"]))
    ids = tokenizer("a red cat", padding="max_length", max_length=CLIP_MAX_LENGTH, return_tensors="pt").input_ids
    pooled = clip(ids).pooler_output
    assert pooled.shape == (1, clip.config.hidden_size)
    # the pooled output is read at the end-of-text token, the first one (padding repeats it)
    first_end = int((ids[0] == tokenizer.eos_token_id).nonzero()[0])
    assert torch.equal(pooled, clip(ids).last_hidden_state[:, first_end])
    words = tokenizer_2("a red cat", return_tensors="pt").input_ids
    assert t5(words).last_hidden_state.shape == (1, words.shape[1], t5.config.d_model)


def test_the_clip_tokenizer_round_trips(tmp_path):
    from transformers import AutoTokenizer, CLIPTokenizer

    tokenizer = build_clip_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    prompt = "A photo of a Red cat, with the dog!"
    expected = tokenizer(prompt).input_ids
    for cls in (AutoTokenizer, CLIPTokenizer):
        again = cls.from_pretrained(str(tmp_path))
        assert type(again).__name__ == "CLIPTokenizer" and again.model_max_length == CLIP_MAX_LENGTH
        assert again(prompt).input_ids == expected
    tokens = tokenizer.convert_ids_to_tokens(expected)
    assert tokens[0] == "<|startoftext|>" and tokens[-1] == "<|endoftext|>"
    assert {"photo</w>", "cat</w>", "dog</w>"} <= set(tokens)  # merged words; others are spelled in bytes
    assert tokenizer.decode(expected, skip_special_tokens=True) == "a photo of a red cat , with the dog !"
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == len(tokenizer) - 1


def test_builds_are_deterministic_for_a_seed(tiny_root, tmp_path):
    again = build_tiny_flux1(tmp_path / "again", FLUX1_KREA_MODEL_ID, seed=0)
    original = tiny_root / FLUX1_KREA_MODEL_ID
    for file in sorted(original.rglob("*")):
        if file.is_file():
            assert file.read_bytes() == (again / file.relative_to(original)).read_bytes(), file
    other = build_tiny_flux1(tmp_path / "other", FLUX1_KREA_MODEL_ID, seed=1)
    for name in ("flux1-krea-dev.safetensors", "ae.safetensors", "text_encoder/model.safetensors"):
        assert (other / name).read_bytes() != (again / name).read_bytes()


def test_an_unknown_release_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"FLUX\.1-schnell.*is not a FLUX\.1 release built here"):
        build_tiny_flux1(tmp_path, "black-forest-labs/FLUX.1-schnell")


@pytest.mark.parametrize("model_id", [FLUX1_DEV_MODEL_ID, FLUX1_KREA_MODEL_ID])
def test_diffusers_flux_pipeline_renders_the_repo(tiny_root, model_id):
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(str(tiny_root / model_id), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    image = pipe(prompt="a red cat", height=32, width=48, num_inference_steps=2, guidance_scale=3.5,
                 max_sequence_length=16, output_type="pt", generator=torch.Generator().manual_seed(0)).images
    assert image.shape == (1, 3, 32, 48) and image.std() > 0


def test_diffusers_flux_kontext_pipeline_renders_the_repo_from_an_image(tiny_root):
    from diffusers import FluxKontextPipeline
    from PIL import Image

    pipe = FluxKontextPipeline.from_pretrained(str(tiny_root / FLUX1_KONTEXT_MODEL_ID), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    images = []
    for colour in ((200, 40, 90), (20, 160, 250)):
        # max_area sets the output size; without _auto_resize the image keeps its size (not Kontext's ~1 MP presets)
        images.append(pipe(image=Image.new("RGB", (48, 32), colour), prompt="make it blue", height=32, width=48,
                           max_area=32 * 48, _auto_resize=False, num_inference_steps=2, guidance_scale=2.5,
                           max_sequence_length=16, output_type="pt", generator=torch.Generator().manual_seed(0)).images)
    assert images[0].shape == (1, 3, 32, 48) and images[0].std() > 0
    assert not torch.equal(images[0], images[1])  # the input image's tokens condition the result
