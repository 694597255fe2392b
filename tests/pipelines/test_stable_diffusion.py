"""What only Stable Diffusion does: a release whose scheduler config says ``v_prediction`` samples as diffusers' does
and trains on the velocity (the kit covers the epsilon release)."""

import pytest
import torch

from diffsynth.core.loader import ModelConfig
from diffsynth.testing.tiny_stable_diffusion import SD15_PATTERNS, build_tiny_stable_diffusion
from tests.pipelines.family_helpers import assert_same_output, render_ours, render_theirs

V_MODEL_ID = "tiny/stable-diffusion-v-prediction"


@pytest.fixture(scope="module")
def v_repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("sd_v")
    return root, build_tiny_stable_diffusion(root, V_MODEL_ID, seed=5, prediction_type="v_prediction")


@pytest.mark.slow
def test_a_v_prediction_release_samples_as_diffusers_and_trains_on_the_velocity(v_repo, monkeypatch):
    import diffusers

    from diffsynth.pipelines import StableDiffusionPipeline

    root, repo = v_repo
    monkeypatch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(root))
    ours = StableDiffusionPipeline.from_pretrained(torch.float32, "cpu", [
        ModelConfig(model_id=V_MODEL_ID, origin_file_pattern=SD15_PATTERNS[slot])
        for slot in ("unet", "text_encoder", "vae")])
    assert ours.scheduler.prediction_type == "v_prediction"
    theirs = diffusers.StableDiffusionPipeline.from_pretrained(str(repo), dtype=torch.float32)
    theirs.set_progress_bar_config(disable=True)
    assert theirs.scheduler.config.prediction_type == "v_prediction"
    size = {"height": 32, "width": 32}
    image = render_ours(ours, cfg_scale=4.0, **size)
    assert_same_output(image, render_theirs(theirs, guidance_scale=4.0, **size),
                       lambda: render_ours(ours, seed=8, cfg_scale=4.0, **size))
    sample, noise = torch.randn(1, 4, 4, 4), torch.randn(1, 4, 4, 4)
    velocity = theirs.scheduler.get_velocity(sample, noise, torch.tensor([300]))
    assert torch.allclose(ours.scheduler.training_target(sample, noise, torch.tensor([300.0])), velocity, atol=1e-6)
