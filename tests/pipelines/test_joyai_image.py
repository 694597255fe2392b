"""What only JoyAI-Image-Edit does: the released transformer's layout, editing (the edit image read by the text
encoder and beside the latents), and the VAE decoding the kit's latent-level parity check leaves out. The shared
checks (inference equal to diffusers', training, placements, split, LoRA loading, planner) run in the family kit."""

from __future__ import annotations

import diffusers
import numpy as np
import pytest
import torch
from PIL import Image

from diffsynth.pipelines.joyai_image.original import diffusers_key, original_key
from diffsynth.pipelines.joyai_image.pipeline import JoyAIImagePipeline, PromptEmbedderUnit, fit_edit_image
from diffsynth.testing.families import tiny_family
from tests.pipelines.family_helpers import load_ours

PROMPT = "make the sky pink"


@pytest.fixture(scope="module")
def pipe(tiny_root):
    return load_ours(tiny_root, tiny_family("joyai_image"))


@pytest.fixture(scope="module")
def theirs(pipe):
    """diffusers' pipeline on our loaded models (its processor: ours, which transformers builds without torchvision)."""
    return diffusers.JoyImageEditPipeline(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=4.0), vae=pipe.vae,
                                          text_encoder=pipe.text_encoder, tokenizer=pipe.tokenizer,
                                          transformer=pipe.dit, processor=pipe.edit_processor())


@pytest.fixture(scope="module")
def edit_image():
    generator = torch.Generator().manual_seed(0)
    pixels = (torch.rand(40, 56, 3, generator=generator) * 255).to(torch.uint8).numpy()
    return Image.fromarray(pixels)


def test_the_released_transformer_reads_into_diffusers_class(tiny_root, pipe):
    folder = diffusers.JoyImageEditTransformer3DModel.from_pretrained(
        str(tiny_root / "jd-opensource/JoyAI-Image-Edit/transformer"))
    expected, loaded = folder.state_dict(), pipe.dit.state_dict()
    assert set(loaded) == set(expected) and all(torch.equal(loaded[key], expected[key]) for key in expected)
    assert original_key("double_blocks.1.attn.txt_attn_qkv.weight") == "double_blocks.1.txt_attn_qkv.weight"
    assert diffusers_key("model.double_blocks.1.txt_attn_qkv.weight") == "double_blocks.1.attn.txt_attn_qkv.weight"
    assert pipe.dit.config.rope_dim_list == [4, 14, 14]


def test_the_edit_prompt_equals_diffusers(pipe, theirs, edit_image):
    image = fit_edit_image(edit_image, 32, 48)
    ours = PromptEmbedderUnit().process(pipe, PROMPT, edit_image, 32, 48, None)["prompt_emb"]
    reference, mask = theirs.encode_prompt_multiple_images(PROMPT, device="cpu", images=[image])
    assert ours.shape == reference.shape and bool(mask.all())
    assert (ours - reference).abs().max() < 1e-5
    text_only = PromptEmbedderUnit().process(pipe, PROMPT, None, 32, 48, None)["prompt_emb"]
    assert text_only.shape[1] < ours.shape[1]  # the image's vision tokens are part of the caption


def test_the_edit_latents_join_the_transformer_input_as_diffusers_does(pipe, theirs, edit_image):
    image = fit_edit_image(edit_image, 32, 48)
    ours = pipe.encode_image(image)
    pixels = torch.from_numpy(np.array(image)).float() / 127.5 - 1
    encoded = pipe.vae.encode(pixels.permute(2, 0, 1)[None, :, None]).latent_dist.mode()
    assert (ours - theirs.normalize_latents(encoded)[:, :, 0]).abs().max() < 1e-5
    latents, prompt = torch.randn(1, 16, 4, 6), torch.randn(1, 5, 32)
    items = torch.stack([ours, latents], dim=1)[:, :, :, None]
    reference = pipe.dit(hidden_states=items, timestep=torch.tensor([500.0]), encoder_hidden_states=prompt,
                         return_dict=False)[0][:, -1, :, 0]
    edited = pipe.model_fn(latents, 500.0, prompt, edit_latents=ours)
    assert (edited - reference).abs().max() < 1e-5
    assert (edited - pipe.model_fn(latents, 500.0, prompt)).abs().max() > 1e-2


def test_decoding_equals_diffusers(pipe, theirs):
    latents = torch.randn(1, 16, 4, 6, generator=torch.Generator().manual_seed(1))
    ours = pipe.decode({"latents": latents}, {}, {})
    reference = pipe.vae.decode(theirs.denormalize_latents(latents[:, :, None]), return_dict=False)[0][:, :, 0]
    assert (ours - (reference / 2 + 0.5).clamp(0, 1)).abs().max() < 1e-5


def test_an_edit_renders_and_several_edit_images_are_refused(pipe, edit_image):
    image = pipe(PROMPT, edit_image=edit_image, height=32, width=48, seed=3, num_inference_steps=2, cfg_scale=1,
                 output_type="pt", progress_bar=False)
    assert image.shape == (1, 3, 32, 48)
    with pytest.raises(ValueError, match="edits one"):
        JoyAIImagePipeline.__call__(pipe, PROMPT, edit_image=[edit_image, edit_image], height=32, width=48,
                                    num_inference_steps=1, progress_bar=False)
