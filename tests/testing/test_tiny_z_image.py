"""The tiny Z-Image repos: the released layout, one shared text encoder and VAE, deterministic, and rendered by
diffusers' own ``ZImagePipeline`` (Omni-Base: ``ZImageOmniPipeline``, with and without condition images)."""

import json

import pytest
import torch

from diffsynth.testing.tiny_models import BUILDERS
from diffsynth.testing.tiny_z_image import (
    Z_IMAGE_BUILDERS,
    Z_IMAGE_MODEL_ID,
    Z_IMAGE_OMNI_MODEL_ID,
    Z_IMAGE_SCHEDULER_CONFIGS,
    Z_IMAGE_TURBO_MODEL_ID,
    build_tiny_z_image,
)

RELEASES = (Z_IMAGE_MODEL_ID, Z_IMAGE_TURBO_MODEL_ID)
ALL_RELEASES = (*RELEASES, Z_IMAGE_OMNI_MODEL_ID)


def test_the_builders_are_registered():
    assert all(BUILDERS[name] is builder for name, builder in Z_IMAGE_BUILDERS.items())


@pytest.mark.parametrize("model_id", ALL_RELEASES)
def test_repo_has_the_released_layout(tiny_root, model_id):
    repo = tiny_root / model_id
    transformer = sorted(p.name for p in (repo / "transformer").glob("*.safetensors"))
    assert len(transformer) >= 2 and all(n.startswith("diffusion_pytorch_model-0000") for n in transformer)
    index = json.loads((repo / "transformer" / "diffusion_pytorch_model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == transformer
    assert len(list((repo / "text_encoder").glob("model-0000*-of-0000*.safetensors"))) >= 2
    assert [p.name for p in (repo / "vae").glob("*.safetensors")] == ["diffusion_pytorch_model.safetensors"]
    assert (repo / "tokenizer" / "chat_template.jinja").is_file()
    scheduler = json.loads((repo / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler == Z_IMAGE_SCHEDULER_CONFIGS[model_id] and scheduler["use_dynamic_shifting"] is False
    model_index = json.loads((repo / "model_index.json").read_text())
    omni = model_id == Z_IMAGE_OMNI_MODEL_ID
    assert model_index["_class_name"] == ("ZImageOmniPipeline" if omni else "ZImagePipeline")
    assert model_index["transformer"] == ["diffusers", "ZImageTransformer2DModel"]
    assert model_index["text_encoder"] == ["transformers", "Qwen3Model"]
    assert model_index["vae"] == ["diffusers", "AutoencoderKL"]
    transformer_config = json.loads((repo / "transformer" / "config.json").read_text())
    assert (transformer_config["siglip_feat_dim"] is not None) is omni
    if omni:
        assert [p.name for p in (repo / "siglip").glob("*.safetensors")] == ["model.safetensors"]
        siglip_config = json.loads((repo / "siglip" / "config.json").read_text())
        assert siglip_config["architectures"] == ["Siglip2VisionModel"]
        assert siglip_config["hidden_size"] == transformer_config["siglip_feat_dim"]
        processor = json.loads((repo / "siglip_processor" / "preprocessor_config.json").read_text())
        assert processor["image_processor_type"] == "Siglip2ImageProcessor"
        assert processor["patch_size"] == siglip_config["patch_size"]
        assert model_index["siglip"] == ["transformers", "Siglip2VisionModel"]
        assert model_index["siglip_processor"] == ["transformers", "Siglip2ImageProcessor"]
    else:
        assert not (repo / "siglip").exists() and "siglip" not in model_index


def test_the_releases_share_text_encoder_and_vae_but_not_the_transformer(tiny_root):
    base, turbo, omni = (tiny_root / model_id for model_id in ALL_RELEASES)
    for shared in ("vae/diffusion_pytorch_model.safetensors", "text_encoder/model-00001-of-00002.safetensors",
                   "tokenizer/tokenizer.json"):
        assert (base / shared).read_bytes() == (turbo / shared).read_bytes() == (omni / shared).read_bytes()
    name = "transformer/diffusion_pytorch_model-00001-of-00005.safetensors"
    assert (base / name).read_bytes() != (turbo / name).read_bytes()
    # Omni-Base's transformer holds the SigLIP embedder and refiner besides the others' weights.
    omni_keys = json.loads((omni / "transformer/diffusion_pytorch_model.safetensors.index.json").read_text())
    base_keys = json.loads((base / "transformer/diffusion_pytorch_model.safetensors.index.json").read_text())
    extra = set(omni_keys["weight_map"]) - set(base_keys["weight_map"])
    assert extra and all(key.startswith("siglip_") for key in extra)


def test_builds_are_deterministic_for_a_seed(tiny_root, tmp_path):
    again = build_tiny_z_image(tmp_path / "again", Z_IMAGE_TURBO_MODEL_ID, seed=0)
    for file in sorted((tiny_root / Z_IMAGE_TURBO_MODEL_ID).rglob("*")):
        if file.is_file():
            assert file.read_bytes() == (again / file.relative_to(tiny_root / Z_IMAGE_TURBO_MODEL_ID)).read_bytes()
    other = build_tiny_z_image(tmp_path / "other", Z_IMAGE_TURBO_MODEL_ID, seed=1)
    name = "vae/diffusion_pytorch_model.safetensors"
    assert (other / name).read_bytes() != (again / name).read_bytes()


def test_an_unknown_release_is_refused(tmp_path):
    with pytest.raises(ValueError, match="Tongyi-MAI/Z-Image-Edit.*is not a Z-Image release"):
        build_tiny_z_image(tmp_path, "Tongyi-MAI/Z-Image-Edit")


def test_the_chat_template_is_qwen3s_with_thinking_enabled(tiny_root):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_root / Z_IMAGE_TURBO_MODEL_ID / "tokenizer"))
    messages = [{"role": "user", "content": "a cat"}]
    thinking = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             enable_thinking=True)
    assert thinking == "<|im_start|>user\na cat<|im_end|>\n<|im_start|>assistant\n"
    plain = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert plain.endswith("<think>\n\n</think>\n\n") and tokenizer.pad_token == "<|endoftext|>"


@pytest.mark.parametrize("model_id", RELEASES)
def test_diffusers_z_image_pipeline_renders_the_repo(tiny_root, model_id):
    from diffusers import ZImagePipeline

    pipe = ZImagePipeline.from_pretrained(str(tiny_root / model_id), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    kwargs = dict(prompt="a red cat", height=32, width=48, num_inference_steps=2, output_type="pt")
    image = pipe(**kwargs, guidance_scale=0.0, generator=torch.Generator().manual_seed(0)).images
    assert image.shape == (1, 3, 32, 48) and image.std() > 0
    assert pipe.scheduler.config.shift == Z_IMAGE_SCHEDULER_CONFIGS[model_id]["shift"]


def test_the_omni_build_adds_only_its_own_parts(tmp_path, monkeypatch):
    # Counted, not timed: the shared parts are written once per root and seed, and Omni adds only its SigLIP.
    from diffsynth.testing import tiny_z_image

    writes = []
    for name in ("_write_shared", "_write_siglip"):
        original = getattr(tiny_z_image, name)
        monkeypatch.setattr(tiny_z_image, name,
                            lambda *args, _name=name, _original=original: (writes.append(_name), _original(*args))[1])
    build_tiny_z_image(tmp_path, Z_IMAGE_TURBO_MODEL_ID)
    assert writes == ["_write_shared"]
    build_tiny_z_image(tmp_path, Z_IMAGE_MODEL_ID)
    build_tiny_z_image(tmp_path, Z_IMAGE_OMNI_MODEL_ID)
    assert writes == ["_write_shared", "_write_siglip"]


@pytest.mark.parametrize("images", [0, 1, 2])
def test_diffusers_z_image_omni_pipeline_renders_the_repo(tiny_root, images):
    from diffusers import ZImageOmniPipeline
    from PIL import Image

    pipe = ZImageOmniPipeline.from_pretrained(str(tiny_root / Z_IMAGE_OMNI_MODEL_ID), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    # diffusers' pipeline encodes condition images in bfloat16, so its VAE must be bfloat16 for them.
    pipe.vae.to(torch.bfloat16)
    condition = [Image.new("RGB", (64, 80), (40 * i, 200, 90)) for i in range(images)] or None
    image = pipe(image=condition, prompt="a red cat", height=32, width=48, num_inference_steps=2, output_type="pt",
                 guidance_scale=0.0, generator=torch.Generator().manual_seed(0)).images
    assert image.shape == (1, 3, 32, 48) and image.std() > 0
    assert pipe.transformer.siglip_embedder is not None and type(pipe.siglip).__name__ == "Siglip2VisionModel"
