"""What only ERNIE-Image does: the released text encoder's key layout, the sampling shift and the latents'
normalisation. The shared checks (inference equal to diffusers', training, placements, split, LoRA loading in
diffusers, planner) run in the family kit."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from diffsynth.pipelines.ernie_image.pipeline import BATCH_NORM_EPS, ErnieImagePipeline
from diffsynth.testing.families import tiny_family
from tests.pipelines.family_helpers import load_ours, render_ours


@pytest.fixture(scope="module")
def pipe(tiny_root):
    return load_ours(tiny_root, tiny_family("ernie_image"))


def test_the_text_encoder_file_has_the_released_layout(tiny_root, pipe):
    # The reference's converter reads the released file's language model under language_model.model.
    path = tiny_root / "PaddlePaddle/ERNIE-Image/text_encoder/model.safetensors"
    with safe_open(str(path), "pt") as file:
        weights = {key: file.get_tensor(key) for key in file.keys()}
    assert "language_model.model.embed_tokens.weight" in weights
    loaded = pipe.text_encoder.state_dict()
    assert torch.equal(loaded["language_model.embed_tokens.weight"],
                       weights["language_model.model.embed_tokens.weight"])


def test_the_latents_are_normalised_with_the_trained_epsilon(pipe):
    like = torch.zeros(1, 128, 2, 2)
    _, inverse_std = pipe.latent_statistics(like)
    expected = 1 / torch.sqrt(pipe.vae.bn.running_var + BATCH_NORM_EPS)
    assert torch.allclose(inverse_std.flatten(), expected)
    assert pipe.vae.config.batch_norm_eps != BATCH_NORM_EPS  # the config's value would give other latents


def test_sigma_shift_bends_the_schedule(pipe):
    base = render_ours(pipe, height=32, width=32, num_inference_steps=2)
    turbo = render_ours(pipe, height=32, width=32, num_inference_steps=2, sigma_shift=4.0)
    assert (base - turbo).abs().max() > 1e-3
    assert pipe.scheduler.shift == 4.0
    render_ours(pipe, height=32, width=32, num_inference_steps=2)
    assert pipe.scheduler.shift == 3.0


def test_sigma_shift_must_be_positive(pipe):
    with pytest.raises(ValueError, match="sigma_shift=0"):
        ErnieImagePipeline.__call__(pipe, "a cat", sigma_shift=0)
