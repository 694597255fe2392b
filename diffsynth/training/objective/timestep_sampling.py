"""Which noise levels training draws and how the loss is weighted at each: ``--timestep_sampling`` and
``--weighting_scheme``, with ``--min/max_timestep_boundary``.

A draw is a noise level ``sigma`` in [0, 1] (1 is pure noise); the model sees the timestep ``1000 * sigma``. The
names and formulas are those of musubi-tuner (``--timestep_sampling``) and of diffusers' SD3 training utilities
(``--weighting_scheme``), so a recipe from either means the same here:

- ``grid`` (default, the reference trainer's rule): a uniformly drawn index into the model's own 1000-step training
  grid (``FlowMatchScheduler.training_timesteps``: shift 5 for Wan, Qwen-Image's exponential shift at ``mu`` 0.8).
- ``uniform``: ``sigma ~ U(0, 1)``.
- ``sigmoid``: ``sigma = sigmoid(sigmoid_scale * z)`` with ``z ~ N(0, 1)``.
- ``logit_normal``: ``sigma = sigmoid(logit_mean + logit_std * z)`` (SD3's ``lognorm(m, s)``).
- ``shift``: a ``sigmoid`` draw bent by the static shift ``s = discrete_flow_shift``: ``s t / (1 + (s - 1) t)``.
- ``qwen_shift`` / ``flux_shift``: the same bend with ``s = exp(mu)``, ``mu`` linear in the sample's latent token
  count ``(h / 2) * (w / 2)`` (one frame of a video): from 0.5 at 256 tokens to 0.9 at 8192 (Qwen-Image's scheduler
  config) or to 1.15 at 4096 (FLUX's).

``--weighting_scheme`` follows diffusers: ``logit_normal`` and ``mode`` choose *where on the grid* steps are drawn
(``u`` logit-normal, or ``1 - u - mode_scale * (cos^2(pi u / 2) - 1 + u)`` for uniform ``u``; the index is
``floor(u * N)``) and weight every step 1, so they go with ``grid`` only; ``cosmap`` keeps the draw and weights the
loss by ``2 / (pi (1 - 2 sigma + 2 sigma^2))``; ``none`` weights 1. Unset, it is the reference's Gaussian weighting
for ``grid`` and ``none`` for the others, as in musubi-tuner.

The boundaries are fractions of the model's training grid (0: its noisiest end), whatever the rule: ``grid`` draws
indices in ``[int(min * N), int(max * N))``; the continuous rules draw ``sigma`` conditioned on the same range of noise
levels (the grid's sigma at ``min`` down to the one at ``max``), keeping the distribution's shape inside it, so a
Wan2.2 A14B expert split by boundaries trains each expert on its own timesteps with any rule. Every draw is a
function of the ``generator`` alone (one uniform number per sample), which the runner seeds per sample.

The flags and their checks are a section of the trainer's parser, ``config.timesteps.TimestepFlags``, which
:class:`TimestepSampling` extends with the draws; torch is imported by the methods that draw, not by this module.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..config.timesteps import DENSITY_SCHEMES, TimestepFlags
from ..config.timesteps import TimestepSamplingError as TimestepSamplingError  # raised by construction, as before

if TYPE_CHECKING:
    import torch

    from ...diffusion.flow_match import FlowMatchScheduler

#: ``(tokens_1, mu_1, tokens_2, mu_2)``: the line ``mu(tokens)`` of the resolution-dependent shifts.
RESOLUTION_SHIFTS = {"qwen_shift": (256, 0.5, 8192, 0.9), "flux_shift": (256, 0.5, 4096, 1.15)}


@dataclasses.dataclass(frozen=True)
class TimestepSampling(TimestepFlags):
    """The run's timestep flags (:class:`TimestepFlags`, checked at construction) with the draws they select."""

    @classmethod
    def of(cls, flags: TimestepFlags) -> TimestepSampling:
        """The sampling of a run config's timestep section."""
        return flags if isinstance(flags, cls) else cls.from_flags(flags.flags())

    # ---- drawing --------------------------------------------------------------------------------------------------

    def draw(self, scheduler: FlowMatchScheduler, latent_shape: Sequence[int], generator: torch.Generator | None,
             min_boundary: float = 0.0, max_boundary: float = 1.0,
             patch_size: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
        """One sample's timestep and loss weight.

        Args:
            scheduler: The pipeline's schedule: its training grid, and the timestep scale.
            latent_shape: The sample's latents, ``(..., h, w)``; the resolution-dependent shifts read ``h`` and ``w``.
            generator: The sample's generator (CPU); every draw comes from it.
            min_boundary: Lower boundary, a fraction of the training grid (0: its noisiest end).
            max_boundary: Upper boundary.
            patch_size: Latent cells per transformer token side (the pipeline's ``latent_patch_size``), so the
                resolution-dependent shifts count the tokens the transformer sees.

        Returns:
            ``(timestep, weight)``: float32 tensors of shape ``(1,)`` and ``()`` on the CPU.
        """
        if getattr(scheduler, "discrete", False) and self.timestep_sampling != "grid":
            raise TimestepSamplingError([
                f"--timestep_sampling {self.timestep_sampling} draws continuous noise levels, but this model trains on "
                f"{scheduler.num_train_timesteps} discrete DDPM steps; use --timestep_sampling grid (the default)"])
        if self.timestep_sampling == "grid":
            timestep = self._draw_on_grid(scheduler, generator, min_boundary, max_boundary)
        else:
            timestep = self._draw_continuous(scheduler, latent_shape, generator, min_boundary, max_boundary,
                                             patch_size)
        return timestep, self.weight(scheduler, timestep)

    def weight(self, scheduler: FlowMatchScheduler, timestep: torch.Tensor) -> torch.Tensor:
        """The loss weight at ``timestep`` (shape ``()``, float32)."""
        import torch

        if self.is_reference:
            return scheduler.training_weight(timestep).reshape(())
        if self.weighting_scheme == "cosmap":
            sigma = timestep.to(torch.float64).reshape(()) / scheduler.num_train_timesteps
            return (2.0 / (math.pi * (1.0 - 2.0 * sigma + 2.0 * sigma**2))).to(torch.float32)
        return torch.ones((), dtype=torch.float32)

    def _draw_on_grid(self, scheduler: FlowMatchScheduler, generator: torch.Generator | None, min_boundary: float,
                      max_boundary: float) -> torch.Tensor:
        import torch

        if self.weighting_scheme not in DENSITY_SCHEMES:
            # Exactly the reference's draw, so the default rule trains what it always did.
            return scheduler.sample_training_timestep(generator, min_boundary, max_boundary).cpu()
        low, high = scheduler.training_index_range(min_boundary, max_boundary)
        if self.weighting_scheme == "logit_normal":
            normal = torch.randn(1, generator=generator, dtype=torch.float64)
            u = torch.sigmoid(self.parameter("logit_mean") + self.parameter("logit_std") * normal)
        else:
            u = torch.rand(1, generator=generator, dtype=torch.float64)
            u = 1.0 - u - self.parameter("mode_scale") * (torch.cos(math.pi * u / 2.0) ** 2 - 1.0 + u)
        index = (low + torch.floor(u * (high - low))).long().clamp(low, high - 1)
        return scheduler.training_timesteps[index].cpu()

    def _draw_continuous(self, scheduler: FlowMatchScheduler, latent_shape: Sequence[int],
                         generator: torch.Generator | None, min_boundary: float, max_boundary: float,
                         patch_size: int = 2) -> torch.Tensor:
        import torch

        shift = self.shift(latent_shape, patch_size)
        sigma_low, sigma_high = sigma_range(scheduler, min_boundary, max_boundary)
        # Inverse-CDF sampling restricted to [F(sigma_low), F(sigma_high)]: the distribution conditioned on the range.
        start, end = (self.cdf(torch.tensor([value], dtype=torch.float64), shift) for value in (sigma_low, sigma_high))
        u = start + (end - start) * torch.rand(1, generator=generator, dtype=torch.float64)
        sigma = self.quantile(u, shift).clamp(sigma_low, sigma_high)
        return (sigma * scheduler.num_train_timesteps).to(torch.float32)

    def shift(self, latent_shape: Sequence[int], patch_size: int = 2) -> float:
        """The static bend of the continuous rules: ``discrete_flow_shift``, ``exp(mu(tokens))``, or 1 (none); the
        tokens are ``patch_size`` x ``patch_size`` patches of the latent grid."""
        if self.timestep_sampling == "shift":
            return self.parameter("discrete_flow_shift")
        if self.timestep_sampling in RESOLUTION_SHIFTS:
            tokens_1, mu_1, tokens_2, mu_2 = RESOLUTION_SHIFTS[self.timestep_sampling]
            tokens = (latent_shape[-2] // patch_size) * (latent_shape[-1] // patch_size)
            return math.exp(mu_1 + (mu_2 - mu_1) / (tokens_2 - tokens_1) * (tokens - tokens_1))
        return 1.0

    def _normal_location_scale(self) -> tuple[float, float]:
        if self.timestep_sampling == "logit_normal":
            return self.parameter("logit_mean"), self.parameter("logit_std")
        return 0.0, self.parameter("sigmoid_scale")

    def quantile(self, u: torch.Tensor, shift: float = 1.0) -> torch.Tensor:
        """The ``sigma`` at cumulative probability ``u`` (float64) of a continuous rule, for a given bend."""
        import torch

        if self.timestep_sampling == "uniform":
            return u
        location, scale = self._normal_location_scale()
        base = torch.sigmoid(location + scale * torch.special.ndtri(u))
        return shift * base / (1.0 + (shift - 1.0) * base)

    def cdf(self, sigma: torch.Tensor, shift: float = 1.0) -> torch.Tensor:
        """The cumulative probability of ``sigma`` (float64) under a continuous rule: the inverse of ``quantile``."""
        import torch

        if self.timestep_sampling == "uniform":
            return sigma
        location, scale = self._normal_location_scale()
        base = sigma / (shift - (shift - 1.0) * sigma)
        return torch.special.ndtr((torch.log(base) - torch.log1p(-base) - location) / scale)


def sigma_range(scheduler: FlowMatchScheduler, min_boundary: float, max_boundary: float) -> tuple[float, float]:
    """The noise levels ``(low, high)`` the boundaries select: from the grid's first excluded sigma past ``max`` (0
    at the end of the grid) up to its sigma at ``min``."""
    import torch

    low, high = scheduler.training_index_range(min_boundary, max_boundary)
    grid = scheduler.training_timesteps.to(torch.float64) / scheduler.num_train_timesteps
    return (float(grid[high]) if high < len(grid) else 0.0), float(grid[low])
