"""The runner's sources of randomness: per-sample draws that depend on the run's position only."""

import torch

from diffsynth.training.loop.training_loop import sample_generators, step_generator


def test_step_generators_differ_by_sample_and_seed_and_repeat_exactly():
    draw = lambda *key: torch.randn(4, generator=step_generator(*key))  # noqa: E731
    assert torch.equal(draw(1, 7), draw(1, 7))
    assert not torch.equal(draw(1, 7), draw(1, 8))
    assert not torch.equal(draw(1, 7), draw(2, 7))


def test_a_batch_draws_what_its_samples_draw_at_batch_one():
    """Batch 3 of size 4 holds the stream's samples 12 to 15: the micro-batches 12 to 15 of a batch-1 run."""
    batched = [torch.randn(4, generator=g) for g in sample_generators(9, 3, 4, 4)]
    single = [torch.randn(4, generator=sample_generators(9, number, 1, 1)[0]) for number in range(12, 16)]
    assert all(torch.equal(a, b) for a, b in zip(batched, single))
    # A short last batch draws the first positions of its slot.
    assert torch.equal(torch.randn(4, generator=sample_generators(9, 3, 4, 2)[1]), single[1])
