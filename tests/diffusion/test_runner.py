"""The runner's sources of randomness: a data order and per-step draws that depend on the run's position only."""

import torch

from diffsynth.diffusion.runner import EpochShuffleSampler, step_generator


def test_the_order_depends_on_seed_and_epoch_only():
    sampler = EpochShuffleSampler(50, seed=4)
    first = list(sampler)
    assert sorted(first) == list(range(50)) and first == list(EpochShuffleSampler(50, seed=4))
    sampler.set_epoch(1)
    assert list(sampler) != first
    sampler.set_epoch(0)
    assert list(sampler) == first and list(EpochShuffleSampler(50, seed=5)) != first


def test_step_generators_differ_by_sample_and_seed_and_repeat_exactly():
    draw = lambda *key: torch.randn(4, generator=step_generator(*key))  # noqa: E731
    assert torch.equal(draw(1, 7), draw(1, 7))
    assert not torch.equal(draw(1, 7), draw(1, 8))
    assert not torch.equal(draw(1, 7), draw(2, 7))
