"""Timestep rules against their formulas: each distribution by a Kolmogorov-Smirnov test with fixed seeds, the
boundaries, the weights, and the flag checks."""

import bisect
import math

import pytest
import torch

from diffsynth.pipelines.common import scheduler_from_preset
from diffsynth.training.objective.timestep_sampling import TimestepSampling, TimestepSamplingError

DRAWS = 4000
# The Kolmogorov-Smirnov distance a correct sampler exceeds with probability 0.001 at this many draws.
KS_LIMIT = 1.95 / math.sqrt(DRAWS)
LATENTS = (1, 16, 64, 96)  # a 512 x 768 image: 32 x 48 = 1536 tokens of 2 x 2 latent patches


def phi(z):
    if z == math.inf or z == -math.inf:
        return 1.0 if z > 0 else 0.0
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def logit(x):
    if x <= 0.0:
        return -math.inf
    if x >= 1.0:
        return math.inf
    return math.log(x / (1.0 - x))


def unshift(x, shift):
    """The sigma before the bend ``s t / (1 + (s - 1) t)``."""
    return x / (shift - (shift - 1.0) * x)


def draws(sampling, scheduler, boundaries=(0.0, 1.0), latents=LATENTS):
    """Sigmas of ``DRAWS`` samples, each from its own generator as the runner seeds them."""
    values = [sampling.draw(scheduler, latents, torch.Generator().manual_seed(index), *boundaries)[0].item()
              for index in range(DRAWS)]
    return sorted(value / scheduler.num_train_timesteps for value in values)


def ks_distance(sorted_values, cdf):
    """The largest gap between the empirical CDF of ``sorted_values`` and ``cdf``."""
    count = len(sorted_values)
    return max(max(abs((rank + 1) / count - cdf(value)), abs(rank / count - cdf(value)))
               for rank, value in enumerate(sorted_values))


QWEN_TOKENS = (64 // 2) * (96 // 2)
CONTINUOUS = [
    ({"timestep_sampling": "uniform"}, lambda x: x),
    ({"timestep_sampling": "sigmoid"}, lambda x: phi(logit(x))),
    ({"timestep_sampling": "sigmoid", "sigmoid_scale": 2.5}, lambda x: phi(logit(x) / 2.5)),
    ({"timestep_sampling": "logit_normal", "logit_mean": 0.7, "logit_std": 0.6}, lambda x: phi((logit(x) - 0.7) / 0.6)),
    ({"timestep_sampling": "shift"}, lambda x: phi(logit(unshift(x, 3.0)))),
    ({"timestep_sampling": "shift", "discrete_flow_shift": 7.0, "sigmoid_scale": 0.5},
     lambda x: phi(logit(unshift(x, 7.0)) / 0.5)),
    ({"timestep_sampling": "qwen_shift"},
     lambda x: phi(logit(unshift(x, math.exp(0.5 + 0.4 / (8192 - 256) * (QWEN_TOKENS - 256)))))),
    ({"timestep_sampling": "flux_shift"},
     lambda x: phi(logit(unshift(x, math.exp(0.5 + 0.65 / (4096 - 256) * (QWEN_TOKENS - 256)))))),
]


@pytest.mark.parametrize("flags, cdf", CONTINUOUS, ids=[str(flags) for flags, _ in CONTINUOUS])
def test_each_continuous_rule_draws_its_formula(flags, cdf):
    sampling = TimestepSampling(**flags)
    scheduler = scheduler_from_preset("qwen_image")
    assert ks_distance(draws(sampling, scheduler), cdf) < KS_LIMIT
    # The formula is sharp enough to tell rules apart: uniform draws fail any other rule's test.
    if flags["timestep_sampling"] != "uniform":
        assert ks_distance(draws(TimestepSampling("uniform"), scheduler), cdf) > KS_LIMIT


def test_the_resolution_shift_follows_the_token_count():
    sampling = TimestepSampling("qwen_shift")
    scheduler = scheduler_from_preset("qwen_image")
    small, large = (1, 16, 16, 16), (1, 16, 256, 256)  # 64 and 16,384 tokens
    mean = {shape: sum(draws(sampling, scheduler, latents=shape)) / DRAWS for shape in (small, large)}
    assert mean[large] > mean[small] + 0.1  # more tokens, noisier steps
    shift = math.exp(0.5 + 0.4 / (8192 - 256) * (128 * 128 - 256))
    assert ks_distance(draws(sampling, scheduler, latents=large), lambda x: phi(logit(unshift(x, shift)))) < KS_LIMIT


def test_patchified_latents_count_one_token_per_cell():
    """FLUX.2's state holds 2x2-patchified latents: a 64 x 64 grid is 4096 tokens, not 1024."""
    sampling = TimestepSampling("flux_shift")
    shape = (1, 128, 64, 64)
    assert sampling.shift(shape, patch_size=1) == pytest.approx(math.exp(1.15))  # the line's 4096-token end
    assert sampling.shift(shape) == pytest.approx(math.exp(0.5 + 0.65 / 3840 * (1024 - 256)))


def grid_cdf(scheduler, low, high, index_cdf):
    """The CDF in sigma of a draw whose grid index has CDF ``index_cdf`` (the grid falls as the index grows)."""
    sigmas = (scheduler.training_timesteps.double() / scheduler.num_train_timesteps).tolist()

    def cdf(x):
        # P(sigma <= x) = P(index >= the first index whose sigma is <= x)
        first = next((index for index in range(low, high) if sigmas[index] <= x + 1e-12), high)
        return 1.0 - (index_cdf(first - 1) if first > low else 0.0)

    return cdf


def mode_index_cdf(scale, low, high, resolution=200_000):
    """P(index <= k) for the mode density, by evaluating its map on a fine grid of uniform draws."""
    count = high - low
    fractions = sorted(1 - u - scale * (math.cos(math.pi * u / 2) ** 2 - 1 + u)
                       for u in ((i + 0.5) / resolution for i in range(resolution)))
    import bisect

    return lambda k: bisect.bisect_left(fractions, (k + 1 - low) / count) / resolution


GRID = [
    ({}, lambda low, high: lambda k: (k + 1 - low) / (high - low)),
    ({"weighting_scheme": "none"}, lambda low, high: lambda k: (k + 1 - low) / (high - low)),
    ({"weighting_scheme": "logit_normal", "logit_mean": -0.5, "logit_std": 1.2},
     lambda low, high: lambda k: phi((logit((k + 1 - low) / (high - low)) + 0.5) / 1.2)),
    ({"weighting_scheme": "mode"}, lambda low, high: mode_index_cdf(1.29, low, high)),
    ({"weighting_scheme": "mode", "mode_scale": -0.8}, lambda low, high: mode_index_cdf(-0.8, low, high)),
]


@pytest.mark.parametrize("boundaries", [(0.0, 1.0), (0.25, 0.8)])
@pytest.mark.parametrize("flags, index_cdf", GRID, ids=[str(flags) for flags, _ in GRID])
def test_each_grid_rule_draws_its_formula(flags, index_cdf, boundaries):
    scheduler = scheduler_from_preset("wan")
    low, high = int(boundaries[0] * 1000), int(boundaries[1] * 1000)
    values = draws(TimestepSampling("grid", **flags), scheduler, boundaries)
    grid = set((scheduler.training_timesteps.double() / 1000).float().tolist())
    assert all(torch.tensor(value).float().item() in grid for value in values[:50])
    assert ks_distance(values, grid_cdf(scheduler, low, high, index_cdf(low, high))) < KS_LIMIT


def test_the_default_rule_is_the_reference_draw_and_weight():
    scheduler = scheduler_from_preset("qwen_image")
    for seed in range(20):
        timestep, weight = TimestepSampling().draw(scheduler, LATENTS, torch.Generator().manual_seed(seed))
        expected = scheduler.sample_training_timestep(torch.Generator().manual_seed(seed))
        assert torch.equal(timestep, expected) and torch.equal(weight, scheduler.training_weight(expected)[0])


@pytest.mark.parametrize("rule", ["uniform", "sigmoid", "logit_normal", "shift", "qwen_shift"])
def test_boundaries_condition_a_continuous_rule_on_their_range(rule):
    """Inside the range the draw keeps its shape: its CDF is the rule's, renormalised over the range."""
    scheduler = scheduler_from_preset("wan")
    sampling = TimestepSampling(rule)
    full = [value for value in draws(sampling, scheduler)]
    low_sigma = scheduler.training_timesteps[800].item() / 1000
    high_sigma = scheduler.training_timesteps[250].item() / 1000
    values = draws(sampling, scheduler, (0.25, 0.8))
    assert low_sigma <= values[0] and values[-1] <= high_sigma
    # The empirical CDF of unrestricted draws, renormalised to the range, is the reference: no formula needed.
    inside = [value for value in full if low_sigma <= value <= high_sigma]
    assert len(inside) > DRAWS // 20

    def renormalised(x):
        return bisect.bisect_right(inside, x) / len(inside)  # how many are <= x: ``inside`` is sorted, as ``full``

    limit = 1.95 * math.sqrt(1 / DRAWS + 1 / len(inside))  # two-sample test
    assert ks_distance(values, renormalised) < limit


def test_an_expert_split_keeps_each_expert_on_its_side_of_the_boundary_timestep():
    """Wan2.2 A14B: --max_timestep_boundary 0.417 is the high-noise expert's range, the grid down to its index 417
    (timestep 874.85, the release's 875 on the shift-5 grid)."""
    scheduler = scheduler_from_preset("wan")
    boundary = scheduler.training_timesteps[417].item() / 1000
    assert boundary == pytest.approx(0.875, abs=2e-4)
    for rule in ("shift", "logit_normal", "uniform"):
        high_noise = draws(TimestepSampling(rule), scheduler, (0.0, 0.417))
        low_noise = draws(TimestepSampling(rule), scheduler, (0.417, 1.0))
        assert min(high_noise) > boundary - 1e-6 and max(low_noise) <= boundary + 1e-6


def test_weights_follow_their_formulas():
    scheduler = scheduler_from_preset("wan")
    timestep = torch.tensor([300.0])
    sigma = 0.3
    assert TimestepSampling(weighting_scheme="cosmap").weight(scheduler, timestep).item() == pytest.approx(
        2 / (math.pi * (1 - 2 * sigma + 2 * sigma**2)))
    assert TimestepSampling("shift", weighting_scheme="cosmap").weight(scheduler, timestep).item() == pytest.approx(
        2 / (math.pi * (1 - 2 * sigma + 2 * sigma**2)))
    for sampling in (TimestepSampling(weighting_scheme="none"), TimestepSampling(weighting_scheme="mode"),
                     TimestepSampling("sigmoid")):
        assert sampling.weight(scheduler, timestep).item() == 1.0
    reference = TimestepSampling().weight(scheduler, timestep).item()
    assert reference == pytest.approx(scheduler.training_weight(timestep).item()) and reference != 1.0


@pytest.mark.parametrize("flags, fragments", [
    ({"timestep_sampling": "shift", "weighting_scheme": "logit_normal"},
     ["--weighting_scheme logit_normal", "--timestep_sampling grid only, not shift"]),
    ({"timestep_sampling": "uniform", "sigmoid_scale": 2.0},
     ["--sigmoid_scale 2.0 has no effect with --timestep_sampling uniform", "sigmoid, shift, qwen_shift"]),
    ({"discrete_flow_shift": 5.0}, ["--discrete_flow_shift 5.0 has no effect with --timestep_sampling grid"]),
    ({"weighting_scheme": "cosmap", "mode_scale": 1.0}, ["--mode_scale 1.0", "--weighting_scheme mode"]),
    ({"timestep_sampling": "sigmoid", "sigmoid_scale": 0.0}, ["--sigmoid_scale 0.0 must be positive"]),
    ({"timestep_sampling": "logit_normal", "logit_std": -1.0}, ["--logit_std -1.0 must be positive"]),
    ({"weighting_scheme": "mode", "mode_scale": 3.0}, ["--mode_scale 3.0 must lie in [-1, 1.752]"]),
    ({"timestep_sampling": "cosine"}, ["--timestep_sampling 'cosine'", "grid, uniform"]),
])  # fmt: skip
def test_bad_flags_are_named_with_their_fix(flags, fragments):
    with pytest.raises(TimestepSamplingError) as error:
        TimestepSampling(**flags)
    assert all(fragment in str(error.value) for fragment in fragments), str(error.value)


def test_the_draw_is_a_function_of_the_generator():
    scheduler = scheduler_from_preset("qwen_image")
    sampling = TimestepSampling("logit_normal")
    first, again, other = (sampling.draw(scheduler, LATENTS, torch.Generator().manual_seed(seed))[0]
                           for seed in (4, 4, 5))
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert first.dtype == torch.float32 and first.shape == (1,)
