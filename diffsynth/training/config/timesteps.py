"""The timestep flags: ``--timestep_sampling`` and ``--weighting_scheme`` with their parameters, a section of the
trainer's parser checked at construction. What each rule draws, and the formulas, are described and computed in
``objective.timestep_sampling``, which extends this section with the draws; this module imports no torch, so a flag
error is answered before torch loads.
"""

from __future__ import annotations

import argparse
import dataclasses
import math

from .errors import FlagError
from .section import Section

TIMESTEP_SAMPLINGS = ("grid", "uniform", "sigmoid", "logit_normal", "shift", "qwen_shift", "flux_shift")
WEIGHTING_SCHEMES = ("none", "logit_normal", "mode", "cosmap")
#: Weighting schemes that choose where on the grid a step is drawn (diffusers' ``compute_density_for_timestep_sampling``).
DENSITY_SCHEMES = ("logit_normal", "mode")
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
class TimestepFlags(Section):
    """One run's timestep rule and loss weighting, checked at construction; the fields are named after the flags.
    ``objective.timestep_sampling.TimestepSampling`` adds the draws.

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
