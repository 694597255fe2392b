"""SDXL: inference equals diffusers' ``StableDiffusionXLPipeline`` (with DDIM) on the tiny SDXL repo, with a negative
prompt and with the empty one (all zeros, ``force_zeros_for_empty_prompt``)."""

import pytest
import torch

from diffsynth.core.loader import ModelConfig
from diffsynth.testing.tiny_stable_diffusion import SDXL_MODEL_ID, SDXL_PATTERNS
from tests.pipelines.family_helpers import assert_same_output, load_theirs, render_ours, render_theirs


@pytest.fixture(scope="module")
def pipes(tiny_root):
    import diffusers

    from diffsynth.pipelines import StableDiffusionXLPipeline

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        ours = StableDiffusionXLPipeline.from_pretrained(torch.float32, "cpu", [
            ModelConfig(model_id=SDXL_MODEL_ID, origin_file_pattern=SDXL_PATTERNS[slot])
            for slot in ("unet", "text_encoder", "text_encoder_2", "vae")])
    return ours, load_theirs(tiny_root, diffusers.StableDiffusionXLPipeline, SDXL_MODEL_ID)


@pytest.mark.slow
@pytest.mark.parametrize("negative_prompt", ["blurry", None])
def test_sdxl_inference_equals_diffusers(pipes, negative_prompt):
    ours, theirs = pipes
    assert type(ours.text_encoder_2).__name__ == "CLIPTextModelWithProjection" and ours.tokenizer_2 is not None
    size = {"height": 32, "width": 32}
    call = {"cfg_scale": 5.0, "negative_prompt": negative_prompt or "", **size}
    assert_same_output(render_ours(ours, **call),
                       render_theirs(theirs, guidance_scale=5.0, negative_prompt=negative_prompt, **size),
                       lambda: render_ours(ours, seed=8, **call))
