"""FlowMatchScheduler against diffusers' schedulers, plus the training helpers' properties."""

import math

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

from diffsynth.testing.tiny_models import QWEN_IMAGE_SCHEDULER_CONFIG
from diffsynth.diffusion.flow_match import DiffusersScheduler, FlowMatchScheduler
from diffsynth.pipelines.common import scheduler_from_preset

# scheduler/scheduler_config.json of the Wan-AI/Wan2.1-*-Diffusers repos (the parts that matter for sampling).
WAN_DIFFUSERS_SCHEDULER_CONFIG = {
    "final_sigmas_type": "zero",
    "flow_shift": 3.0,
    "num_train_timesteps": 1000,
    "prediction_type": "flow_prediction",
    "solver_order": 2,
    "use_flow_sigmas": True,
}
# (height, width) in pixels; the last one is past max_image_seq_len, where mu extrapolates.
IMAGE_SIZES = [(256, 256), (512, 768), (928, 1664), (1328, 1328), (2048, 2048)]
STEP_COUNTS = [2, 10, 28, 50]


def diffusers_qwen_schedule(num_steps: int, height: int, width: int) -> FlowMatchEulerDiscreteScheduler:
    """The scheduler after the set_timesteps call that diffusers' QwenImagePipeline makes."""
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(QWEN_IMAGE_SCHEDULER_CONFIG)
    image_seq_len = (height // 16) * (width // 16)  # latents.shape[1]: VAE factor 8, then 2x2 packing
    config = scheduler.config
    slope = (config.max_shift - config.base_shift) / (config.max_image_seq_len - config.base_image_seq_len)
    mu = image_seq_len * slope + (config.base_shift - slope * config.base_image_seq_len)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / num_steps, num_steps), mu=mu)
    return scheduler


@pytest.mark.parametrize("num_steps", STEP_COUNTS)
@pytest.mark.parametrize("height,width", IMAGE_SIZES)
def test_qwen_image_inference_schedule_matches_diffusers(num_steps, height, width):
    reference = diffusers_qwen_schedule(num_steps, height, width)
    ours = scheduler_from_preset("qwen_image")
    ours.set_timesteps(num_steps, image_seq_len=(height // 16) * (width // 16))
    assert ours.sigmas.dtype == torch.float32 and len(ours.sigmas) == num_steps
    torch.testing.assert_close(ours.sigmas, reference.sigmas[:-1], atol=1e-6, rtol=0)
    torch.testing.assert_close(ours.timesteps, reference.timesteps, atol=1e-6 * 1000, rtol=0)
    assert ours.sigmas[-1].item() == pytest.approx(0.02, abs=1e-6)


@pytest.mark.parametrize("num_steps,height,width", [(10, 512, 768), (28, 1328, 1328)])
def test_step_matches_diffusers_over_a_whole_loop(num_steps, height, width):
    reference = diffusers_qwen_schedule(num_steps, height, width)
    ours = FlowMatchScheduler.from_diffusers_config(QWEN_IMAGE_SCHEDULER_CONFIG)
    ours.set_timesteps(num_steps, image_seq_len=(height // 16) * (width // 16))
    generator = torch.Generator().manual_seed(0)
    sample = torch.randn(1, 24, 64, generator=generator)
    ours_sample, reference_sample = sample.clone(), sample.clone()
    for ours_t, reference_t in zip(ours.timesteps, reference.timesteps):
        velocity = torch.randn(sample.shape, generator=generator)
        ours_sample = ours.step(velocity, ours_t, ours_sample)
        reference_sample = reference.step(velocity, reference_t, reference_sample, return_dict=False)[0]
        torch.testing.assert_close(ours_sample, reference_sample, atol=1e-5, rtol=1e-6)


def test_wan_preset_is_a_plain_shift_of_five():
    ours = scheduler_from_preset("Wan")
    ours.set_timesteps(30)
    grid = torch.linspace(1.0, 0.0, 31, dtype=torch.float64)[:-1]
    torch.testing.assert_close(ours.sigmas, (5 * grid / (1 + 4 * grid)).float())
    reference = FlowMatchEulerDiscreteScheduler(shift=5.0)
    reference.set_timesteps(sigmas=np.linspace(1.0, 1 / 30, 30))
    torch.testing.assert_close(ours.timesteps, reference.timesteps, atol=1e-3, rtol=0)


def test_denoising_strength_starts_lower_on_the_same_curve():
    ours = scheduler_from_preset("wan")
    ours.set_timesteps(10, denoising_strength=0.5)
    assert ours.sigmas[0].item() == pytest.approx(5 * 0.5 / (1 + 4 * 0.5))
    assert torch.all(ours.sigmas[1:] < ours.sigmas[:-1])


def test_euler_with_the_true_velocity_walks_the_straight_path_to_the_data():
    ours = scheduler_from_preset("qwen_image")
    ours.set_timesteps(8, image_seq_len=4096)
    generator = torch.Generator().manual_seed(1)
    data, noise = torch.randn(2, 3, 5, generator=generator), torch.randn(2, 3, 5, generator=generator)
    sample = ours.add_noise(data, noise, ours.timesteps[0])
    torch.testing.assert_close(sample, (1 - ours.sigmas[0]) * data + ours.sigmas[0] * noise)
    for index, timestep in enumerate(ours.timesteps):
        velocity = ours.training_target(data, noise, timestep)
        torch.testing.assert_close(velocity, noise - data)
        sample = ours.step(velocity, timestep, sample)
        if index + 1 < len(ours.timesteps):
            torch.testing.assert_close(sample, ours.add_noise(data, noise, ours.timesteps[index + 1]))
    torch.testing.assert_close(sample, data, atol=1e-5, rtol=0)


def test_add_noise_takes_one_timestep_per_sample_and_keeps_the_dtype():
    ours = scheduler_from_preset("wan")
    data, noise = torch.zeros(3, 2, 4, dtype=torch.bfloat16), torch.ones(3, 2, 4, dtype=torch.bfloat16)
    noisy = ours.add_noise(data, noise, torch.tensor([0.0, 500.0, 1000.0]))
    assert noisy.dtype == torch.bfloat16
    assert noisy[:, 0, 0].tolist() == [0.0, 0.5, 1.0]
    with pytest.raises(ValueError, match=r"timestep shape \(2,\)"):
        ours.add_noise(data, noise, torch.tensor([1.0, 2.0]))


def test_qwen_training_grid_is_the_diffusers_schedule_at_mu_0_8():
    ours = scheduler_from_preset("qwen_image")
    reference = FlowMatchEulerDiscreteScheduler.from_config(QWEN_IMAGE_SCHEDULER_CONFIG)
    reference.set_timesteps(sigmas=np.linspace(1.0, 1 / 1000, 1000), mu=0.8)
    assert len(ours.training_timesteps) == 1000
    torch.testing.assert_close(ours.training_timesteps, reference.timesteps, atol=1e-3, rtol=0)


def test_sample_training_timestep_respects_boundaries_and_the_generator():
    ours = scheduler_from_preset("wan")
    first = ours.sample_training_timestep(torch.Generator().manual_seed(3), batch_size=64)
    again = ours.sample_training_timestep(torch.Generator().manual_seed(3), batch_size=64)
    assert first.shape == (64,) and first.dtype == torch.float32 and torch.equal(first, again)
    assert set(first.tolist()) <= set(ours.training_timesteps.tolist())
    # The grid runs from high noise to low: the upper half of the index range is the low-noise half.
    late = ours.sample_training_timestep(torch.Generator().manual_seed(4), 0.5, 1.0, batch_size=256)
    assert late.max() <= ours.training_timesteps[500] and late.min() >= ours.training_timesteps[-1]
    early = ours.sample_training_timestep(torch.Generator().manual_seed(4), 0.0, 0.5, batch_size=256)
    assert early.min() >= ours.training_timesteps[499]
    for low, high in [(0.5, 0.5), (-0.1, 1.0), (0.0, 1.5), (0.9991, 0.9999)]:
        with pytest.raises(ValueError, match=f"min_boundary={low}, max_boundary={high}"):
            ours.sample_training_timestep(None, low, high)


@pytest.mark.parametrize("preset", ["qwen_image", "wan"])
def test_training_weight_is_a_positive_centred_bump_of_mean_one(preset):
    ours = scheduler_from_preset(preset)
    weights = ours.training_weight(ours.training_timesteps)
    assert torch.all(weights > 0)
    assert weights.mean().item() == pytest.approx(1.0, abs=1e-5)
    offsets = torch.tensor([1.0, 100.0, 250.0, 499.0])
    torch.testing.assert_close(ours.training_weight(500 + offsets), ours.training_weight(500 - offsets))
    curve = ours.training_weight(torch.arange(0.0, 1001.0))
    assert int(curve.argmax()) == 500
    assert (curve[0] / curve[500]).item() == pytest.approx(math.exp(-0.5))


def test_diffusers_adapter_reproduces_the_wan_pipeline_loop():
    generator = torch.Generator().manual_seed(5)
    sample = torch.randn(1, 4, 2, 8, 8, generator=generator)
    outputs = [torch.randn(sample.shape, generator=generator) for _ in range(6)]
    raw = UniPCMultistepScheduler(**WAN_DIFFUSERS_SCHEDULER_CONFIG)
    raw.set_timesteps(6)
    raw.set_begin_index(0)
    expected = sample
    for timestep, output in zip(raw.timesteps, outputs):
        expected = raw.step(output, timestep, expected, return_dict=False)[0]
    adapter = DiffusersScheduler(UniPCMultistepScheduler(**WAN_DIFFUSERS_SCHEDULER_CONFIG))
    adapter.set_timesteps(6)
    result = sample
    for timestep, output in zip(adapter.timesteps, outputs):
        result = adapter.step(output, timestep, result)
    torch.testing.assert_close(result, expected, atol=0, rtol=0)
    adapter.set_timesteps(6, denoising_strength=0.5)
    torch.testing.assert_close(adapter.timesteps, raw.timesteps[3:])


def test_diffusers_adapter_passes_the_qwen_arguments_through():
    adapter = DiffusersScheduler(FlowMatchEulerDiscreteScheduler.from_config(QWEN_IMAGE_SCHEDULER_CONFIG))
    ours = scheduler_from_preset("qwen_image")
    adapter.set_timesteps(20, sigmas=np.linspace(1.0, 1 / 20, 20), mu=ours.compute_mu(4096))
    ours.set_timesteps(20, image_seq_len=4096)
    torch.testing.assert_close(ours.timesteps, adapter.timesteps, atol=1e-3, rtol=0)


def test_errors_name_the_value_and_the_fix():
    ours = scheduler_from_preset("qwen_image")
    with pytest.raises(RuntimeError, match="set_timesteps"):
        ours.step(torch.zeros(1), 1000.0, torch.zeros(1))
    with pytest.raises(ValueError, match="image_seq_len"):
        ours.set_timesteps(10)
    ours.set_timesteps(10, image_seq_len=1024)
    with pytest.raises(ValueError, match="not an index"):
        ours.step(torch.zeros(1), 3, torch.zeros(1))
    with pytest.raises(ValueError, match="denoising_strength=0"):
        ours.set_timesteps(10, 0, image_seq_len=1024)
    with pytest.raises(ValueError, match="'sdxl'"):
        scheduler_from_preset("sdxl")
    with pytest.raises(ValueError, match="use_karras_sigmas"):
        FlowMatchScheduler.from_diffusers_config({**QWEN_IMAGE_SCHEDULER_CONFIG, "use_karras_sigmas": True})
    with pytest.raises(ValueError, match="UniPCMultistepScheduler"):
        FlowMatchScheduler.from_diffusers_config({"_class_name": "UniPCMultistepScheduler"})
