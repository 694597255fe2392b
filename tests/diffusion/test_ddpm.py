"""``DDPMSchedule``: the noising, targets and draws of UNet training equal diffusers' DDPM math, and sampling is
diffusers' DDIM from a release's config."""

import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler

from diffsynth.diffusion.ddpm import DDPMSchedule
from diffsynth.pipelines.stable_diffusion.pipeline import SD15_SCHEDULER_CONFIG
from diffsynth.training.objective.timestep_sampling import TimestepSampling, TimestepSamplingError

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def latents():
    generator = torch.Generator().manual_seed(0)
    return torch.randn(2, 4, 8, 8, generator=generator), torch.randn(2, 4, 8, 8, generator=generator)


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction"])
def test_noising_and_targets_equal_diffusers_ddpm(latents, prediction_type):
    config = {**SD15_SCHEDULER_CONFIG, "prediction_type": prediction_type}
    ours, theirs = DDPMSchedule(config), DDPMScheduler.from_config(config)
    sample, noise = latents
    timestep = torch.tensor([999.0, 17.0])
    noisy = ours.add_noise(sample, noise, timestep)
    assert torch.allclose(noisy, theirs.add_noise(sample, noise, timestep.long()), atol=1e-6)
    target = ours.training_target(sample, noise, timestep)
    expected = noise if prediction_type == "epsilon" else theirs.get_velocity(sample, noise, timestep.long())
    assert torch.allclose(target, expected, atol=1e-6)
    # Teeth: another step noises far differently.
    assert (ours.add_noise(sample, noise, torch.tensor([500.0, 17.0])) - noisy).abs().max() > 0.5


def test_a_release_pndm_config_samples_with_ddim_and_the_grid_is_discrete():
    schedule = DDPMSchedule({**SD15_SCHEDULER_CONFIG, "_class_name": "PNDMScheduler", "skip_prk_steps": True})
    schedule.set_timesteps(4)
    reference = DDIMScheduler.from_config(SD15_SCHEDULER_CONFIG)
    reference.set_timesteps(4)
    assert type(schedule.sampler) is DDIMScheduler and torch.equal(schedule.timesteps, reference.timesteps)
    schedule.set_timesteps(4, denoising_strength=0.5)
    assert torch.equal(schedule.timesteps, reference.timesteps[2:])
    assert schedule.training_timesteps[0] == 999 and schedule.training_timesteps[-1] == 0
    drawn = schedule.sample_training_timestep(torch.Generator().manual_seed(1), 0.0, 0.5, batch_size=64)
    assert torch.all(drawn == drawn.round()) and drawn.min() >= 500
    assert schedule.training_weight(drawn[:1]) == 1


def test_refusals_name_the_setting():
    with pytest.raises(ValueError, match="prediction_type='sample'"):
        DDPMSchedule({**SD15_SCHEDULER_CONFIG, "prediction_type": "sample"})
    schedule = DDPMSchedule(SD15_SCHEDULER_CONFIG)
    with pytest.raises(TimestepSamplingError, match="--timestep_sampling uniform .* use --timestep_sampling grid"):
        TimestepSampling(timestep_sampling="uniform").draw(schedule, (1, 4, 8, 8), None)
    timestep, weight = TimestepSampling().draw(schedule, (1, 4, 8, 8), torch.Generator().manual_seed(0))
    assert 0 <= timestep.item() <= 999 and weight.item() == 1
