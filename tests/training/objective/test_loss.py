"""Losses against an oracle denoiser that knows the clean latents: the right velocity scores zero, others do not."""

import pytest
import torch

from diffsynth.diffusion import BasePipeline
from diffsynth.pipelines.common import scheduler_from_preset
from diffsynth.training.objective.loss import DirectDistillLoss, FlowMatchSFTLoss

CLEAN = torch.randn(1, 4, 6, 6, generator=torch.Generator().manual_seed(0))


class OraclePipeline(BasePipeline):
    """Predicts ``sign * (noise - clean)`` from the noisy latents, knowing the clean ones."""

    model_fn_params = ("prompt_emb",)

    def __init__(self, sign=1.0):
        super().__init__()
        self.scheduler = scheduler_from_preset("wan")
        self.sign = sign
        self.seen = []

    def model_fn(self, latents, timestep, prompt_emb, **_):
        self.seen.append(prompt_emb)
        sigma = torch.as_tensor(timestep, dtype=torch.float32).reshape(-1)[0] / 1000
        return self.sign * (latents - CLEAN) / sigma


def state():
    return {"input_latents": CLEAN.clone()}, {"prompt_emb": "posi"}, {"prompt_emb": "nega"}


def test_sft_loss_is_zero_for_the_true_velocity_only():
    pipe = OraclePipeline()
    loss = FlowMatchSFTLoss()(pipe, *state(), generator=torch.Generator().manual_seed(1))
    assert loss.item() < 1e-8 and pipe.seen == ["posi"]
    # A reversed velocity is off by twice the target, |2 * (noise - clean)| ~ 2.8 per element.
    reversed_loss = FlowMatchSFTLoss()(OraclePipeline(sign=-1.0), *state(), generator=torch.Generator().manual_seed(1))
    assert reversed_loss.item() > 1.0


def test_the_generator_alone_decides_the_draws():
    pipe = OraclePipeline(sign=-1.0)
    losses = [FlowMatchSFTLoss()(pipe, *state(), generator=torch.Generator().manual_seed(s)) for s in (3, 3, 4)]
    assert torch.equal(losses[0], losses[1]) and not torch.equal(losses[0], losses[2])


def test_boundaries_restrict_the_timesteps():
    pipe = OraclePipeline(sign=-1.0)
    seen = []
    pipe.model_fn = lambda latents, timestep, **_: seen.append(float(timestep[0])) or latents
    for seed in range(20):
        FlowMatchSFTLoss(0.0, 0.1)(pipe, *state(), generator=torch.Generator().manual_seed(seed))
    assert min(seen) >= float(pipe.scheduler.training_timesteps[99]) and max(seen) <= 1000
    with pytest.raises(ValueError, match="need 0 <= min < max <= 1"):
        FlowMatchSFTLoss(0.5, 0.5)


def test_direct_distill_lands_on_the_clean_latents_with_the_oracle():
    pipe = OraclePipeline()
    loss = DirectDistillLoss(num_inference_steps=4)(pipe, *state(), generator=torch.Generator().manual_seed(2))
    assert loss.item() < 1e-10 and len(pipe.seen) == 4
    assert DirectDistillLoss(2)(OraclePipeline(sign=-1.0), *state()).item() > 0.1
    with pytest.raises(ValueError, match="num_inference_steps=0"):
        DirectDistillLoss(0)


def test_a_state_without_latents_names_the_dataset_flags():
    with pytest.raises(ValueError, match="--data_file_keys"):
        FlowMatchSFTLoss()(OraclePipeline(), {}, {"prompt_emb": 1}, {})


@pytest.mark.parametrize("loss", [FlowMatchSFTLoss(), DirectDistillLoss(2)])
def test_a_batch_loss_is_the_mean_of_its_samples_losses_with_their_own_draws(loss):
    """Each sample draws from its own generator in any batch; the batch's loss averages the samples'."""
    pipe = OraclePipeline(sign=-1.0)
    clean = torch.randn(3, 4, 6, 6, generator=torch.Generator().manual_seed(8))
    pipe.model_fn = lambda latents, timestep, **_: latents * 0.5  # a model that does not know the clean latents
    alone = [loss(pipe, {"input_latents": clean[i:i + 1]}, {"prompt_emb": 0}, {},
                  generator=torch.Generator().manual_seed(10 + i)) for i in range(3)]
    batched = loss(pipe, {"input_latents": clean}, {"prompt_emb": 0}, {},
                   generators=[torch.Generator().manual_seed(10 + i) for i in range(3)])
    torch.testing.assert_close(batched, torch.stack(alone).mean())
    with pytest.raises(ValueError, match="2 generators for a batch of 3 samples"):
        loss(pipe, {"input_latents": clean}, {"prompt_emb": 0}, {}, generators=[None, None])
