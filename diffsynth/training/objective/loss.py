"""Training losses over a pipeline's state: flow-matching SFT and direct distillation.

A loss receives the three state dicts after the training stage's units have run and returns a scalar. Randomness
(timesteps, noise) comes only from the ``generator`` the runner passes, seeded per optimizer step and process, so a
run draws the same values whether it computes the state itself or reads it from a stage-1 cache, and a resumed run
draws what an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from ...diffusion.base_pipeline import BasePipeline, StateKey
from .loss_mask import LOSS_MASK_KEY, LossMask
from .timestep_sampling import TimestepSampling


def _model_inputs(inputs_shared: dict, inputs_posi: dict, **overrides: Any) -> dict:
    return {**inputs_shared, **inputs_posi, **overrides}


def _noise_like(latents: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Noise drawn on the generator's device (the CPU by default, the same on every machine), moved to the latents."""
    device = generator.device if generator is not None else torch.device("cpu")
    noise = torch.randn(latents.shape, generator=generator, device=device, dtype=torch.float32)
    return noise.to(latents.device, latents.dtype)


def _per_sample(generators: Sequence[torch.Generator | None] | None, generator: torch.Generator | None,
                latents: torch.Tensor) -> list[torch.Generator | None]:
    """One generator per sample of the batch: ``generators``, or ``generator`` for all of them."""
    generators = [generator] * latents.shape[0] if generators is None else list(generators)
    if len(generators) != latents.shape[0]:
        raise ValueError(f"{len(generators)} generators for a batch of {latents.shape[0]} samples; pass one per sample")
    return generators


def _per_sample_mse(prediction: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None
                    ) -> torch.Tensor:
    """The mean squared error of each sample of the batch, in float32: shape ``(batch,)``.

    ``weight`` (a loss mask's, broadcast over the elements) multiplies each squared error before the plain mean, so
    weights of exactly 1 give exactly the unweighted loss and weights of 0 give 0 (``loss_mask``).
    """
    squared = (prediction.float() - target.float()).square()
    if weight is not None:
        squared = squared * weight
    return squared.reshape(squared.shape[0], -1).mean(dim=1)


def _input_latents(inputs_shared: dict) -> torch.Tensor:
    latents = inputs_shared.get("input_latents")
    if latents is None:
        raise ValueError("the training state holds no 'input_latents': each sample needs an image (or video) to "
                         "learn from; check the dataset's file columns and --data_file_keys")
    return latents


def weighted_mean(losses: torch.Tensor, sample_weights: torch.Tensor | None = None) -> torch.Tensor:
    """The batch's loss: the per-sample ``losses``, each times its entry of ``sample_weights`` (e.g.
    ``--prior_loss_weight`` for a regularization sample; None: all 1), averaged over the batch."""
    if sample_weights is None:
        return losses.mean()
    return (losses * sample_weights.to(losses.device, losses.dtype)).mean()


class LatentsLoss:
    """A loss that reads ``input_latents`` and calls ``model_fn``; subclasses implement ``per_sample`` and hold a
    ``mask`` field (a ``LossMask`` under ``--masked_loss``, else None)."""

    mask: LossMask | None

    @staticmethod
    def required_keys(pipe: BasePipeline) -> tuple[StateKey, ...]:
        """The state keys this loss reads after the units: the split keeps them exact and stage 1 caches them."""
        return (("shared", "input_latents"), *model_fn_keys(pipe))

    def state_keys(self, pipe: BasePipeline) -> tuple[StateKey, ...]:
        """``required_keys``, and the loss mask when this loss is masked."""
        keys = self.required_keys(pipe)
        return (*keys, ("shared", LOSS_MASK_KEY)) if self.mask is not None else keys

    def per_sample_losses(self, pipe: BasePipeline, inputs_shared: dict, prediction: torch.Tensor,
                          target: torch.Tensor) -> torch.Tensor:
        """The squared error of each sample over each of the pipeline's ``loss_regions``, each averaged on its own and
        then added up (a region that scores some samples only adds 0 to the others), weighted by the mask if any."""
        weight = self.mask.weights(inputs_shared, target) if self.mask is not None else None
        losses = []
        for region in pipe.loss_regions(inputs_shared):
            rows = None
            if region is not None and torch.is_tensor(region[0]):  # the samples the region scores
                rows, region = region[0], (slice(None), *region[1:])
            if region is None:
                loss = _per_sample_mse(prediction, target, weight)
            else:
                loss = _per_sample_mse(prediction[region], target[region], None if weight is None else weight[region])
            losses.append(loss if rows is None else loss * rows.to(loss.device, loss.dtype))
        return sum(losses)

    def per_sample(self, pipe: BasePipeline, inputs_shared: dict, inputs_posi: dict, inputs_nega: dict,
                   generator: torch.Generator | None = None,
                   generators: Sequence[torch.Generator | None] | None = None) -> torch.Tensor:
        """The loss of each sample of the batch, shape ``(batch,)``."""
        raise NotImplementedError

    def __call__(self, pipe: BasePipeline, inputs_shared: dict, inputs_posi: dict, inputs_nega: dict,
                 generator: torch.Generator | None = None,
                 generators: Sequence[torch.Generator | None] | None = None,
                 sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        """The batch's loss: :meth:`per_sample` averaged with ``sample_weights`` (:func:`weighted_mean`)."""
        losses = self.per_sample(pipe, inputs_shared, inputs_posi, inputs_nega, generator, generators)
        return weighted_mean(losses, sample_weights)


@dataclasses.dataclass
class FlowMatchSFTLoss(LatentsLoss):
    """Flow-matching velocity regression, weighted over timesteps like the reference trainer.

    Each call draws a timestep between the boundaries by the ``sampling`` rule (by default the reference's: a
    uniform index into the scheduler's training grid, with its Gaussian loss weight) and fresh noise, noises
    ``input_latents`` to it, and regresses ``model_fn``'s prediction on the velocity ``noise - input_latents``.

    Args:
        min_timestep_boundary: Lower end of the drawn part of the training grid, as a fraction (0: noisiest end).
        max_timestep_boundary: Upper end, as a fraction.
        sampling: The timestep rule and loss weighting (``--timestep_sampling``, ``--weighting_scheme``).
        mask: Weigh each element by the sample's loss mask (``--masked_loss``); None: unmasked.
    """

    min_timestep_boundary: float = 0.0
    max_timestep_boundary: float = 1.0
    sampling: TimestepSampling = dataclasses.field(default_factory=TimestepSampling)
    mask: LossMask | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_timestep_boundary < self.max_timestep_boundary <= 1.0:
            raise ValueError(f"min_timestep_boundary={self.min_timestep_boundary}, max_timestep_boundary="
                             f"{self.max_timestep_boundary}: need 0 <= min < max <= 1")

    def per_sample(self, pipe: BasePipeline, inputs_shared: dict, inputs_posi: dict, inputs_nega: dict,
                   generator: torch.Generator | None = None,
                   generators: Sequence[torch.Generator | None] | None = None) -> torch.Tensor:
        """The timestep-weighted loss of each sample; ``inputs_nega`` is unused (training runs without CFG).

        Each sample draws its timestep, then its noise, from its own entry of ``generators`` (default: all from
        ``generator``), so a sample draws the same values in any batch.
        """
        input_latents = _input_latents(inputs_shared)
        generators = _per_sample(generators, generator, input_latents)
        timesteps, weights, noises = [], [], []
        for index, sample_generator in enumerate(generators):
            timestep, weight = self.sampling.draw(pipe.scheduler, input_latents.shape, sample_generator,
                                                  self.min_timestep_boundary, self.max_timestep_boundary,
                                                  pipe.latent_patch_size)
            timesteps.append(timestep)
            weights.append(weight.reshape(1))
            noises.append(_noise_like(input_latents[index:index + 1], sample_generator))
        timestep = torch.cat(timesteps).to(input_latents.device)
        noise = torch.cat(noises)
        noisy = pipe.scheduler.add_noise(input_latents, noise, timestep)
        target = pipe.scheduler.training_target(input_latents, noise, timestep)
        prediction = pipe.model_fn(**_model_inputs(inputs_shared, inputs_posi, latents=noisy, timestep=timestep))
        losses = self.per_sample_losses(pipe, inputs_shared, prediction, target)
        return losses * torch.cat(weights).to(losses.device)


@dataclasses.dataclass
class DirectDistillLoss(LatentsLoss):
    """Trains a few-step sampler: run the whole short denoising loop with gradients, match the clean latents.

    The metadata says per sample how the student samples (the reference's distillation datasets: columns ``seed``,
    ``rand_device``, ``num_inference_steps``, ``cfg_scale`` passed with ``--extra_inputs``): the loop starts from
    the noise the pipeline draws from ``seed`` on ``rand_device``, exactly as inference with that seed does (without
    a seed, from noise drawn like the SFT loss's), runs ``num_inference_steps`` steps, and guides each prediction
    with ``cfg_scale`` (the negative prompt is the empty one) when it is not 1.

    Memory grows with the number of steps, since every step's activations are kept for backward (twice with CFG);
    use gradient checkpointing for more than a handful.

    Args:
        num_inference_steps: Steps of the distilled sampler for samples that do not give theirs.
        mask: Weigh each element of the clean-latent match by the sample's loss mask (``--masked_loss``).
    """

    num_inference_steps: int = 8
    mask: LossMask | None = None
    #: Inputs read from the state after the units, besides the latents (given per sample by ``--extra_inputs``).
    sample_inputs = ("seed", "num_inference_steps", "cfg_scale")

    def __post_init__(self) -> None:
        if self.num_inference_steps < 1:
            raise ValueError(f"num_inference_steps={self.num_inference_steps} must be at least 1")

    @staticmethod
    def required_keys(pipe: BasePipeline) -> tuple[StateKey, ...]:
        """The SFT keys, the seeded noise and the per-sample settings, and the negative branch for CFG."""
        negative = tuple(("nega", name) for name in pipe.model_fn_params)
        own = tuple(("shared", name) for name in ("noise", *DirectDistillLoss.sample_inputs))
        return (*LatentsLoss.required_keys(pipe), *own, *negative)

    def per_sample(self, pipe: BasePipeline, inputs_shared: dict, inputs_posi: dict, inputs_nega: dict,
                   generator: torch.Generator | None = None,
                   generators: Sequence[torch.Generator | None] | None = None) -> torch.Tensor:
        """The loss of each sample; each sample's noise comes from its entry of ``generators``."""
        input_latents = _input_latents(inputs_shared)
        steps = inputs_shared.get("num_inference_steps") or self.num_inference_steps
        pipe.set_inference_timesteps(steps, latent_shape=tuple(input_latents.shape))
        if inputs_shared.get("seed") is not None:
            latents = inputs_shared["noise"].to(input_latents.device, input_latents.dtype)
        else:
            generators = _per_sample(generators, generator, input_latents)
            latents = torch.cat([_noise_like(input_latents[index:index + 1], sample_generator)
                                 for index, sample_generator in enumerate(generators)])
        for timestep in pipe.scheduler.timesteps:
            timestep = timestep.to(latents.device)
            prediction = pipe.predict_noise({**inputs_shared, "latents": latents}, inputs_posi, inputs_nega, timestep)
            latents = pipe.scheduler.step(prediction, timestep, latents)
        return self.per_sample_losses(pipe, inputs_shared, latents, input_latents)


def model_fn_keys(pipe: BasePipeline) -> tuple[StateKey, ...]:
    """The keys ``pipe.model_fn`` reads, in the shared and the positive scope (the merged state holds both)."""
    return tuple((scope, name) for name in pipe.model_fn_params for scope in ("shared", "posi"))


LOSSES = {"sft": FlowMatchSFTLoss, "direct_distill": DirectDistillLoss}
