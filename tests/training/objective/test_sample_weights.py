"""Per-sample loss weights (``--prior_loss_weight``): each sample's loss, as computed alone, times its weight, averaged
over the batch; a weight of 0 leaves the sample out of the gradient."""

import pytest
import torch

from diffsynth.training.objective.loss import DirectDistillLoss, FlowMatchSFTLoss, weighted_mean
from tests.training.objective.test_loss import OraclePipeline


@pytest.mark.parametrize("loss", [FlowMatchSFTLoss(), DirectDistillLoss(2)])
def test_weights_multiply_each_samples_own_loss_before_the_mean(loss):
    pipe = OraclePipeline(sign=-1.0)
    pipe.model_fn = lambda latents, timestep, **_: latents * 0.5
    clean = torch.randn(3, 4, 6, 6, generator=torch.Generator().manual_seed(8))
    # The independent reference: each sample's loss computed alone, with its own draws.
    alone = torch.stack([loss(pipe, {"input_latents": clean[i:i + 1]}, {"prompt_emb": 0}, {},
                              generator=torch.Generator().manual_seed(10 + i)) for i in range(3)])
    weights = torch.tensor([1.0, 0.25, 0.0])
    batched = loss(pipe, {"input_latents": clean}, {"prompt_emb": 0}, {},
                   generators=[torch.Generator().manual_seed(10 + i) for i in range(3)], sample_weights=weights)
    torch.testing.assert_close(batched, (alone * weights).sum() / 3)
    per_sample = loss.per_sample(pipe, {"input_latents": clean}, {"prompt_emb": 0}, {},
                                 generators=[torch.Generator().manual_seed(10 + i) for i in range(3)])
    torch.testing.assert_close(per_sample, alone)


def test_a_zero_weight_sample_gets_no_gradient():
    losses = torch.tensor([0.5, 2.0], requires_grad=True)
    weighted_mean(losses, torch.tensor([1.0, 0.0])).backward()
    assert losses.grad.tolist() == [0.5, 0.0]
    assert weighted_mean(torch.tensor([1.0, 3.0])).item() == 2.0
