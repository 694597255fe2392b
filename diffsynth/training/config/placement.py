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
from typing import TYPE_CHECKING, Any

from .errors import FlagError
from .section import Section

if TYPE_CHECKING:
    from ...core.offload_training import BlockSwapConfig


class PlacementError(FlagError):
    """Placement flags conflict; ``problems`` holds one message per conflict, each naming flag, value and fix."""


@dataclasses.dataclass(frozen=True)
class PlacementConfig(Section):
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

    LOWER_BOUNDS = (
        ("blocks_to_swap", 0, True, "--blocks_to_swap 10, or 0 for no block swap"),
        ("offload_prefetch_depth", 0, True, "--offload_prefetch_depth 1, or 0 for no prefetch"),
        ("block_swap_ring_size", 1, True, "--block_swap_ring_size 2"),
    )
    EXAMPLES = {"cpu_offload_split_threshold": "--cpu_offload_split_threshold 256"}
    ERROR = PlacementError

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, video: bool = False) -> None:
        """Adds the Gradient checkpointing, Offload training, Block swap, Several GPUs and Memory planner groups.

        For ``video`` (the Wan trainer) checkpointing is on whatever the flag says, as the reference's Wan trainer
        forces it: a video's activations do not fit otherwise.
        """
        group = parser.add_argument_group("Gradient checkpointing")
        # musubi-tuner spells it --gradient_checkpointing; both names set the same flag.
        names = ("--use_gradient_checkpointing", "--gradient_checkpointing")
        if video:
            group.add_argument(*names, action="store_true", default=True,
                               help="Recompute activations in the backward pass. Always on for video (Wan) training, "
                                    "as the reference's Wan trainer forces it: a video's activations do not fit "
                                    "otherwise. Also spelled --gradient_checkpointing.")
        else:
            group.add_argument(*names, action="store_true",
                               help="Recompute activations in the backward pass: much less VRAM, about a third slower. "
                                    "Also spelled --gradient_checkpointing (musubi-tuner).")
        group.add_argument("--use_gradient_checkpointing_offload", action="store_true",
                           help="Also keep the checkpointed activations in CPU memory; implies "
                                "--use_gradient_checkpointing. Least VRAM, slower still.")
        group = parser.add_argument_group("Offload training")
        group.add_argument("--enable_model_cpu_offload", action="store_true",
                           help="Keep the weights on the CPU and move each layer to the GPU only while it runs; "
                                "2-10x slower, weight VRAM of one layer.")
        group.add_argument("--enable_optimizer_cpu_offload", action="store_true",
                           help="With --enable_model_cpu_offload, also keep trainable weights, gradients and optimizer "
                                "state on the CPU; for full fine-tunes that do not fit otherwise.")
        group.add_argument("--cpu_offload_split_threshold", type=float, default=None,
                           help="Experimental (MB): modules larger than this are offloaded piece by piece rather than "
                                "as a whole; unset offloads leaf layers.")
        group.add_argument("--offload_prefetch_depth", type=int, default=None,
                           help="Units whose weights are copied ahead of use on a side stream while the current one "
                                "computes; unset: 1 on CUDA, 0 elsewhere. Each extra unit costs its weights in memory.")
        group = parser.add_argument_group("Block swap")
        group.add_argument("--blocks_to_swap", type=int, default=0,
                           help="Blocks of the transformer kept in host memory and moved to the GPU only while they "
                                "compute; 0 turns block swap off.")
        group.add_argument("--block_swap_h2d_only", action="store_true",
                           help="Stream those blocks' frozen weights into a small ring of GPU slots, host-to-device "
                                "only (LoRA training; needs --use_gradient_checkpointing).")
        group.add_argument("--block_swap_ring_size", type=int, default=2,
                           help="GPU slots for streamed blocks with --block_swap_h2d_only; more slots, more overlap.")
        group.add_argument("--use_pinned_memory_for_block_swap", action="store_true",
                           help="Keep swapped weights in pinned host memory: faster copies, RAM locked for the run.")
        group = parser.add_argument_group("Several GPUs on one machine")
        group.add_argument("--shared_host_weights", choices=("auto", "off"), default="auto",
                           help="auto: with several processes on a machine, the frozen weights that offload or block "
                                "swap keep in host memory are loaded once per machine into shared memory (RAM for one "
                                "copy instead of one per GPU); off: each process loads its own copy.")
        group = parser.add_argument_group("Memory planner")
        group.add_argument("--vram_budget", type=str, default=None,
                           help="GPU memory in GB the run may use, or auto (free memory less 0.5 GB): the planner "
                                "predicts every placement before loading and picks the fastest that fits. Offload or "
                                "block swap flags given explicitly win; then it only predicts and warns.")
        group.add_argument("--ram_budget", type=str, default=None,
                           help="Host memory in GB the run may use, or auto (available memory less 2 GB); planned "
                                "together with --vram_budget.")

    def problems(self) -> list[str]:
        return (super().problems() + self._split_threshold_problems() + self._cross_flag_problems()
                + self._budget_problems() + self._choice_problems())

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
        from ...core.offload_training import BlockSwapConfig  # torch: the flag parser imports this module

        return BlockSwapConfig(self.blocks_to_swap, h2d_only=self.block_swap_h2d_only,
                               ring_size=self.block_swap_ring_size,
                               use_pinned_memory=self.use_pinned_memory_for_block_swap,
                               gradient_checkpointing=self.gradient_checkpointing)

    def offload_options(self, trains: bool) -> dict[str, Any]:
        """Keyword arguments of ``OffloadTrainingManager`` for a model that ``trains`` (or only computes)."""
        return dict(enable_optimizer_cpu_offload=self.enable_optimizer_cpu_offload and trains,
                    cpu_offload_split_threshold=self.cpu_offload_split_threshold,
                    prefetch_depth=self.offload_prefetch_depth)

    def _split_threshold_problems(self) -> list[str]:
        threshold = self.cpu_offload_split_threshold
        if threshold is not None and math.isfinite(threshold) and threshold <= 0:
            return [f"--cpu_offload_split_threshold {threshold} must be a positive size in MB, e.g. "
                    f"--cpu_offload_split_threshold 256, or drop it to offload leaf layers"]
        return []

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
