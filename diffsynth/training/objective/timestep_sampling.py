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

The flags are a section of the trainer's parser, which answers a flag error before torch is imported; so torch is
imported by the methods that draw, not by this module.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import FlagError
from ..section import Section

if TYPE_CHECKING:
    import torch

    from ...diffusion.flow_match import FlowMatchScheduler

TIMESTEP_SAMPLINGS = ("grid", "uniform", "sigmoid", "logit_normal", "shift", "qwen_shift", "flux_shift")
WEIGHTING_SCHEMES = ("none", "logit_normal", "mode", "cosmap")
#: Weighting schemes that choose where on the grid a step is drawn (diffusers' ``compute_density_for_timestep_sampling``).
DENSITY_SCHEMES = ("logit_normal", "mode")
#: ``(tokens_1, mu_1, tokens_2, mu_2)``: the line ``mu(tokens)`` of the resolution-dependent shifts.
RESOLUTION_SHIFTS = {"qwen_shift": (256, 0.5, 8192, 0.9), "flux_shift": (256, 0.5, 4096, 1.15)}
#: The SD3 paper's range of ``mode_scale`` in which the mode density stays a density (the map stays monotone).
MODE_SCALE_RANGE = (-1.0, 2.0 / (math.pi - 2.0))
DEFAULTS = {"sigmoid_scale": 1.0, "logit_mean": 0.0, "logit_std": 1.0, "discrete_flow_shift": 3.0, "mode_scale": 1.29}
#: The parameter flags each rule reads; a flag given to a rule that ignores it is refused.
READS = {"grid": (), "uniform": (), "sigmoid": ("sigmoid_scale",), "logit_normal": ("logit_mean", "logit_std"),
         "shift": ("sigmoid_scale", "discrete_flow_shift"), "qwen_shift": ("sigmoid_scale",),
         "flux_shift": ("sigmoid_scale",)}
SCHEME_READS = {"logit_normal": ("logit_mean", "logit_std"), "mode": ("mode_scale",)}


class TimestepSamplingError(FlagError):
    """The sampling flags conflict; ``problems`` holds one message per problem, each naming flag, value and fix."""


@dataclasses.dataclass(frozen=True)
class TimestepSampling(Section):
    """One run's timestep rule and loss weighting, checked at construction; the fields are named after the flags.

    Parameters left ``None`` take ``DEFAULTS``.

    Raises:
        TimestepSamplingError: Every problem at once: an unknown rule or scheme, a density scheme with a continuous
            rule, a parameter the rule ignores, or a parameter out of range.
    """

    timestep_sampling: str = "grid"
    weighting_scheme: str | None = None
    sigmoid_scale: float | None = None
    logit_mean: float | None = None
    logit_std: float | None = None
    discrete_flow_shift: float | None = None
    mode_scale: float | None = None

    ERROR = TimestepSamplingError

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, video: bool = False) -> None:
        """Adds the Timestep sampling group (docs Timestep_Sampling)."""
        group = parser.add_argument_group("Timestep sampling")
        group.add_argument("--timestep_sampling", type=str, default="grid", choices=TIMESTEP_SAMPLINGS,
                           help="How training draws its noise levels: grid draws uniformly from the model's own "
                                "shifted 1000-step grid (the reference's rule); uniform, sigmoid, logit_normal, shift, "
                                "qwen_shift and flux_shift draw continuously as musubi-tuner does (the shift rules "
                                "bend a sigmoid draw, qwen/flux by the sample's resolution). Always within "
                                "--min/max_timestep_boundary.")
        group.add_argument("--weighting_scheme", type=str, default=None, choices=WEIGHTING_SCHEMES,
                           help="Loss weighting as diffusers names it: none; cosmap; logit_normal and mode draw the "
                                "grid non-uniformly (with --timestep_sampling grid) and weight 1. Unset: the "
                                "reference's Gaussian weighting for grid, none for the continuous rules.")
        group.add_argument("--sigmoid_scale", type=float, default=None,
                           help="Scale of the normal draw of sigmoid, shift, qwen_shift and flux_shift; larger spreads "
                                "them towards uniform. Unset: 1.0.")
        group.add_argument("--logit_mean", type=float, default=None,
                           help="Mean of the logit-normal draw (--timestep_sampling logit_normal, --weighting_scheme "
                                "logit_normal); positive favours noisier steps. Unset: 0.0.")
        group.add_argument("--logit_std", type=float, default=None,
                           help="Standard deviation of the logit-normal draw. Unset: 1.0.")
        group.add_argument("--discrete_flow_shift", type=float, default=None,
                           help="Shift of --timestep_sampling shift: s*t/(1+(s-1)*t) bends draws towards noise for s > "
                                "1. Unset: 3.0.")
        group.add_argument("--mode_scale", type=float, default=None,
                           help="Scale of --weighting_scheme mode, between -1 and 1.75; positive favours the middle of "
                                "the grid. Unset: 1.29.")

    def problems(self) -> list[str]:
        problems = super().problems() + self._choice_problems()
        if problems:
            return problems
        return self._unused_problems() + self._range_problems()

    def _choice_problems(self) -> list[str]:
        problems = []
        if self.timestep_sampling not in TIMESTEP_SAMPLINGS:
            problems.append(f"--timestep_sampling {self.timestep_sampling!r} is not a rule; choose one of "
                            f"{', '.join(TIMESTEP_SAMPLINGS)}")
        if self.weighting_scheme is not None and self.weighting_scheme not in WEIGHTING_SCHEMES:
            problems.append(f"--weighting_scheme {self.weighting_scheme!r} is not a scheme; choose one of "
                            f"{', '.join(WEIGHTING_SCHEMES)}")
        if self.weighting_scheme in DENSITY_SCHEMES and self.timestep_sampling != "grid":
            problems.append(f"--weighting_scheme {self.weighting_scheme} decides where on the model's timestep grid "
                            f"steps are drawn (diffusers' rule), so it goes with --timestep_sampling grid only, not "
                            f"{self.timestep_sampling}; pass --timestep_sampling grid, or --weighting_scheme none "
                            "(or cosmap) with a continuous rule such as --timestep_sampling logit_normal")
        return problems

    def _unused_problems(self) -> list[str]:
        reads = set(READS[self.timestep_sampling]) | set(SCHEME_READS.get(self.weighting_scheme, ()))
        problems = []
        for name in DEFAULTS:
            value = getattr(self, name)
            # A non-finite value is the finite-flag check's to report: one complaint per flag.
            if value is not None and math.isfinite(value) and name not in reads:
                users = [rule for rule, names in READS.items() if name in names]
                users += [f"--weighting_scheme {scheme}" for scheme, names in SCHEME_READS.items() if name in names]
                problems.append(f"--{name} {value} has no effect with --timestep_sampling {self.timestep_sampling}"
                                f"{f' --weighting_scheme {self.weighting_scheme}' if self.weighting_scheme else ''}; "
                                f"drop it (it shapes {', '.join(users)})")
        return problems

    def _range_problems(self) -> list[str]:
        problems = []
        for name in ("sigmoid_scale", "logit_std", "discrete_flow_shift"):
            value = getattr(self, name)
            if value is not None and math.isfinite(value) and value <= 0:
                problems.append(f"--{name} {value} must be positive; pass e.g. --{name} {DEFAULTS[name]}")
        low, high = MODE_SCALE_RANGE
        if self.mode_scale is not None and math.isfinite(self.mode_scale) and not low <= self.mode_scale <= high:
            problems.append(f"--mode_scale {self.mode_scale} must lie in [{low:g}, {high:.3f}] (beyond it the mode "
                            f"density is no density); pass e.g. --mode_scale {DEFAULTS['mode_scale']}")
        return problems

    def parameter(self, name: str) -> float:
        """A parameter's value, its default when unset."""
        value = getattr(self, name)
        return DEFAULTS[name] if value is None else float(value)

    @property
    def is_reference(self) -> bool:
        """Whether this is the reference trainer's rule: uniform grid indices with its Gaussian loss weighting."""
        return self.timestep_sampling == "grid" and self.weighting_scheme is None

    def describe(self) -> str:
        """The rule with its parameters, for the start-of-run log."""
        reads = [*READS[self.timestep_sampling], *SCHEME_READS.get(self.weighting_scheme, ())]
        parameters = ", ".join(f"{name}={self.parameter(name):g}" for name in reads)
        weighting = self.weighting_scheme or ("reference" if self.timestep_sampling == "grid" else "none")
        return f"{self.timestep_sampling}{f' ({parameters})' if parameters else ''}, weighting {weighting}"

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
