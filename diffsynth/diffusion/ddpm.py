"""The discrete DDPM noise schedule of UNet families (Stable Diffusion 1.x / 2.x, SDXL): training on 1000 steps, sampling
with DDIM.

A UNet release trains on ``num_train_timesteps`` discrete noise levels: ``x_t = sqrt(a_t) x_0 + sqrt(1 - a_t) eps`` with
``a_t`` the cumulative product of ``1 - beta`` (``beta_schedule`` ``scaled_linear`` or ``linear``, from the release's
``scheduler/scheduler_config.json``), and learns the noise ``eps`` (``prediction_type: epsilon``) or the velocity
``v = sqrt(a_t) eps - sqrt(1 - a_t) x_0`` (``v_prediction``). :class:`DDPMSchedule` offers the training interface the
losses use with a flow-match schedule (``training_timesteps``, ``add_noise``, ``training_target``, ``training_weight``),
so ``FlowMatchSFTLoss`` trains either without knowing which, and samples with diffusers' own ``DDIMScheduler`` (eta 0)
built from the same config, so inference is diffusers' step for step.

The training grid runs from the noisiest step down (``999, 998, ..., 0``), as the flow-match grids do, so
``--min_timestep_boundary`` / ``--max_timestep_boundary`` mean the same fractions here. Every grid step weighs 1 (the
reference trainer's DDIM weighting).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

#: What a UNet release may learn (``sample`` prediction is not trained here).
PREDICTION_TYPES = ("epsilon", "v_prediction")


class DDPMSchedule:
    """The discrete noise schedule of a UNet release: training draws, noising and targets, and DDIM sampling.

    Args:
        config: The release's ``scheduler_config.json`` (any diffusers DDPM-family scheduler: ``PNDMScheduler``,
            ``DDIMScheduler``, ``EulerDiscreteScheduler``, ...); its ``beta_*``, ``num_train_timesteps``,
            ``prediction_type``, ``timestep_spacing``, ``steps_offset`` and ``set_alpha_to_one`` are used.

    Raises:
        ValueError: A ``prediction_type`` other than ``epsilon`` or ``v_prediction`` (``sample`` is not trained here).
    """

    #: Timesteps are grid steps: only ``--timestep_sampling grid`` draws them (``TimestepSampling.draw``).
    discrete = True

    def __init__(self, config: Mapping[str, Any]) -> None:
        from diffusers import DDIMScheduler

        prediction = config.get("prediction_type", "epsilon")
        if prediction not in PREDICTION_TYPES:
            raise ValueError(f"scheduler config prediction_type={prediction!r} is not trained here; use one of "
                             f"{PREDICTION_TYPES}")
        #: diffusers' DDIM sampler (eta 0), which also computes the betas and their cumulative products.
        self.sampler = DDIMScheduler.from_config(dict(config))
        self.prediction_type = prediction
        self.num_train_timesteps = int(self.sampler.config.num_train_timesteps)
        self.alphas_cumprod = self.sampler.alphas_cumprod.to(torch.float64)
        self.training_timesteps = torch.arange(self.num_train_timesteps - 1, -1, -1, dtype=torch.float32)
        self.timesteps = torch.empty(0, dtype=torch.long)

    # ---- sampling -------------------------------------------------------------------------------------------------

    def set_timesteps(self, num_inference_steps: int, denoising_strength: float = 1.0, **_: Any) -> None:
        """DDIM's schedule for ``num_inference_steps`` steps (the config's ``timestep_spacing``); a
        ``denoising_strength`` below 1 drops the first steps, as diffusers' image-to-image pipeline does."""
        if num_inference_steps < 1:
            raise ValueError(f"num_inference_steps={num_inference_steps} must be at least 1")
        if not 0 < denoising_strength <= 1:
            raise ValueError(f"denoising_strength={denoising_strength} must lie in (0, 1]")
        self.sampler.set_timesteps(num_inference_steps)
        kept = min(int(num_inference_steps * denoising_strength), num_inference_steps)
        self.timesteps = self.sampler.timesteps[num_inference_steps - kept:]

    def step(self, model_output: torch.Tensor, timestep: torch.Tensor | int, sample: torch.Tensor) -> torch.Tensor:
        """One deterministic DDIM step (eta 0) from ``timestep`` to the previous one of the schedule."""
        return self.sampler.step(model_output, timestep, sample, eta=0.0, return_dict=False)[0]

    # ---- training -------------------------------------------------------------------------------------------------

    def _coefficients(self, timestep: torch.Tensor | float, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sqrt(a_t), sqrt(1 - a_t))`` as float32, one per sample, shaped to broadcast over ``like``."""
        index = torch.as_tensor(timestep).detach().to("cpu", torch.float64).round().long().reshape(-1)
        if index.numel() not in (1, like.shape[0]):
            raise ValueError(f"timestep shape {tuple(index.shape)} must be () or (batch={like.shape[0]},)")
        if index.min() < 0 or index.max() >= self.num_train_timesteps:
            raise ValueError(f"timestep {index.tolist()} lies outside the schedule's 0..{self.num_train_timesteps - 1}")
        alpha = self.alphas_cumprod[index]
        shape = (-1,) + (1,) * (like.dim() - 1)
        return (alpha.sqrt().view(shape).to(like.device, torch.float32),
                (1 - alpha).sqrt().view(shape).to(like.device, torch.float32))

    def add_noise(self, original: torch.Tensor, noise: torch.Tensor, timestep: torch.Tensor | float) -> torch.Tensor:
        """``sqrt(a_t) * original + sqrt(1 - a_t) * noise`` at the discrete step ``timestep`` (rounded)."""
        signal, sigma = self._coefficients(timestep, original)
        return (signal * original.float() + sigma * noise.float()).to(original.dtype)

    def training_target(self, sample: torch.Tensor, noise: torch.Tensor,
                        timestep: torch.Tensor | float | None = None) -> torch.Tensor:
        """What the UNet learns: the noise (``epsilon``) or ``sqrt(a_t) noise - sqrt(1 - a_t) sample``
        (``v_prediction``)."""
        if self.prediction_type == "epsilon":
            return noise
        if timestep is None:
            raise ValueError("a v_prediction target depends on the timestep; pass it")
        signal, sigma = self._coefficients(timestep, sample)
        return (signal * noise.float() - sigma * sample.float()).to(sample.dtype)

    def training_index_range(self, min_boundary: float = 0.0, max_boundary: float = 1.0) -> tuple[int, int]:
        """The index range ``[int(min * N), int(max * N))`` of ``training_timesteps`` (noisiest first).

        Raises:
            ValueError: The boundaries are not ``0 <= min < max <= 1`` or select no step.
        """
        low, high = int(min_boundary * self.num_train_timesteps), int(max_boundary * self.num_train_timesteps)
        if not 0.0 <= min_boundary < max_boundary <= 1.0 or high <= low:
            raise ValueError(f"min_boundary={min_boundary}, max_boundary={max_boundary}: need 0 <= min < max <= 1 "
                             f"spanning at least one of {self.num_train_timesteps} training timesteps")
        return low, high

    def sample_training_timestep(self, generator: torch.Generator | None = None, min_boundary: float = 0.0,
                                 max_boundary: float = 1.0, batch_size: int = 1) -> torch.Tensor:
        """Draws discrete steps uniformly from ``training_timesteps[int(min * N):int(max * N)]`` (float32)."""
        low, high = self.training_index_range(min_boundary, max_boundary)
        device = generator.device if generator is not None else torch.device("cpu")
        index = torch.randint(low, high, (batch_size,), generator=generator, device=device)
        return self.training_timesteps.to(device)[index]

    def training_weight(self, timestep: torch.Tensor | float) -> torch.Tensor:
        """1 at every step: the DDPM objective weighs its steps alike."""
        return torch.ones_like(torch.as_tensor(timestep, dtype=torch.float32))
