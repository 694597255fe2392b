"""Where a run keeps its weights and activations: one configuration, made once from the flags and checked there.

The offload, block swap, gradient checkpointing and memory planner flags decide together where every weight and
activation lives, so their rules are checked together, here, when the object is built: ``parse_args`` builds one to
report every conflict before anything loads, the trainer builds the one it hands to the runner, and the runner reads
nothing else. The engine's own config classes (``OffloadTrainingConfig``, ``BlockSwapConfig``) are made from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from ...core.offload_training import BlockSwapConfig


class PlacementError(ValueError):
    """Placement flags conflict; ``problems`` holds one message per conflict, each naming flag, value and fix."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


# (flag, smallest value allowed, an example fix); unset optional flags are not checked.
_LOWER_BOUNDS = (
    ("blocks_to_swap", 0, "--blocks_to_swap 10, or 0 for no block swap"),
    ("offload_prefetch_depth", 0, "--offload_prefetch_depth 1, or 0 for no prefetch"),
    ("block_swap_ring_size", 1, "--block_swap_ring_size 2"),
)


@dataclasses.dataclass(frozen=True)
class PlacementConfig:
    """The placement flags of one run, checked at construction; the fields are named after the flags.

    Raises:
        PlacementError: Every conflict at once, each naming the flag, the value and the fix.
    """

    enable_model_cpu_offload: bool = False
    enable_optimizer_cpu_offload: bool = False
    cpu_offload_split_threshold: float | None = None
    offload_prefetch_depth: int | None = None
    use_gradient_checkpointing: bool = False
    use_gradient_checkpointing_offload: bool = False
    blocks_to_swap: int = 0
    block_swap_h2d_only: bool = False
    block_swap_ring_size: int = 2
    use_pinned_memory_for_block_swap: bool = False
    vram_budget: str | None = None
    ram_budget: str | None = None
    shared_host_weights: str = "auto"

    def __post_init__(self) -> None:
        problems = (self._bound_problems() + self._cross_flag_problems() + self._budget_problems()
                    + self._choice_problems())
        if problems:
            raise PlacementError(problems)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PlacementConfig:
        """Reads the placement flags of a trainer ``Namespace`` (from ``build_parser``: every flag is there)."""
        return cls(**{field.name: getattr(args, field.name) for field in dataclasses.fields(cls)})

    @property
    def gradient_checkpointing(self) -> bool:
        """Whether blocks are checkpointed (``--use_gradient_checkpointing_offload`` implies it)."""
        return self.use_gradient_checkpointing or self.use_gradient_checkpointing_offload

    @property
    def planned(self) -> bool:
        """Whether the memory planner runs (a budget is given)."""
        return self.vram_budget is not None or self.ram_budget is not None

    @property
    def weights_on_host(self) -> bool:
        """Whether the weights are streamed from host memory (offload, block swap), so they are loaded there: loading
        them onto the device first would need the device memory the placement is there to save."""
        return self.enable_model_cpu_offload or self.blocks_to_swap > 0

    @property
    def block_swap(self) -> BlockSwapConfig:
        """The block swap settings of a training run (``enabled`` is False without ``--blocks_to_swap``)."""
        return BlockSwapConfig(self.blocks_to_swap, h2d_only=self.block_swap_h2d_only,
                               ring_size=self.block_swap_ring_size,
                               use_pinned_memory=self.use_pinned_memory_for_block_swap,
                               gradient_checkpointing=self.gradient_checkpointing)

    def offload_options(self, trains: bool) -> dict[str, Any]:
        """Keyword arguments of ``OffloadTrainingManager`` for a model that ``trains`` (or only computes)."""
        return dict(enable_optimizer_cpu_offload=self.enable_optimizer_cpu_offload and trains,
                    cpu_offload_split_threshold=self.cpu_offload_split_threshold,
                    prefetch_depth=self.offload_prefetch_depth)

    def _bound_problems(self) -> list[str]:
        problems = []
        for name, bound, example in _LOWER_BOUNDS:
            value = getattr(self, name)
            if value is not None and value < bound:
                problems.append(f"--{name} {value} must be at least {bound}; pass e.g. {example}")
        threshold = self.cpu_offload_split_threshold
        if threshold is not None and math.isfinite(threshold) and threshold <= 0:  # nan and inf: parsers refuse them
            problems.append(f"--cpu_offload_split_threshold {threshold} must be a positive size in MB, e.g. "
                            f"--cpu_offload_split_threshold 256, or drop it to offload leaf layers")
        return problems

    def shares_host_weights(self, num_processes: int) -> bool:
        """Whether the weights kept in host memory (offload, block swap) load once per machine into shared memory:
        with several processes, unless ``--shared_host_weights off``."""
        return self.weights_on_host and num_processes > 1 and self.shared_host_weights == "auto"

    def _choice_problems(self) -> list[str]:
        if self.shared_host_weights in ("auto", "off"):
            return []
        return [f"--shared_host_weights {self.shared_host_weights} must be auto (one host copy per machine) or off "
                "(one per process)"]

    def _budget_problems(self) -> list[str]:
        problems = []
        for flag, value, example in (("vram_budget", self.vram_budget, 24), ("ram_budget", self.ram_budget, 64)):
            if value is None or value == "auto":
                continue
            try:
                valid = float(value) > 0
            except ValueError:
                valid = False
            if not valid:
                problems.append(f"--{flag} {value} must be a positive size in GB (e.g. --{flag} {example}) or auto "
                                "(what the machine has free, less a margin)")
        return problems

    def _cross_flag_problems(self) -> list[str]:
        problems = []
        offload = self.enable_model_cpu_offload
        if self.enable_optimizer_cpu_offload and not offload:
            problems.append("--enable_optimizer_cpu_offload only works together with --enable_model_cpu_offload; "
                            "add --enable_model_cpu_offload, or drop --enable_optimizer_cpu_offload")
        if self.cpu_offload_split_threshold is not None and not offload:
            problems.append(f"--cpu_offload_split_threshold {self.cpu_offload_split_threshold} has no effect without "
                            "--enable_model_cpu_offload; add --enable_model_cpu_offload, or drop "
                            "--cpu_offload_split_threshold")
        if self.offload_prefetch_depth is not None and not offload:
            problems.append(f"--offload_prefetch_depth {self.offload_prefetch_depth} has no effect without "
                            "--enable_model_cpu_offload; add --enable_model_cpu_offload, or drop --offload_prefetch_depth")
        if self.blocks_to_swap and offload:
            problems.append(f"--blocks_to_swap {self.blocks_to_swap} and --enable_model_cpu_offload both move the "
                            "transformer's weights; use one of them (--enable_model_cpu_offload keeps less on the GPU, "
                            "block swap moves whole blocks)")
        if self.block_swap_h2d_only and not self.blocks_to_swap:
            problems.append("--block_swap_h2d_only streams the blocks --blocks_to_swap selects; add --blocks_to_swap N")
        if self.block_swap_h2d_only and not self.gradient_checkpointing:
            problems.append("--block_swap_h2d_only reuses a few GPU slots, which only works when each block is "
                            "recomputed in backward; add --use_gradient_checkpointing")
        return problems
