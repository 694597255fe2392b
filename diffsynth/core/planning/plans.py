"""Candidate placements of a training run, their predicted memory and step time, and the choice among them.

A ``Workload`` is the denoiser of a run built on the meta device (its LoRA injected, the run's shape in its step);
``predict`` combines what it measures there (``footprint.py``, ``residency.py``) with a ``DeviceProfile`` into the
peak device memory, the peak host memory and the step time of one ``Plan``; ``choose`` takes the fastest plan that
fits both budgets. The components and their assumptions:

- device memory = weights that stay on the device + the policy's moving weights at their peak (its residency meter)
  + trained weights, their gradients and the optimizer's state (``training_state.py``: by optimizer class, one
  gradient at a time with the fused step or optimizer offload) + activations + models the stage also runs, plus the
  CUDA context (the profile's ``context_bytes``) and the caching allocator's slack (``ALLOCATOR_SLACK``). Activations at the
  peak are what the forward saved plus, in backward, a gradient and an input of the largest saved tensor's size and,
  under checkpointing, the recomputed activations of the block being differentiated (an assumption about the
  working set, to be checked on a GPU with ``scripts/bench_planner.py``). ``allocated`` leaves out context and slack:
  it is the figure to compare with ``torch.cuda.max_memory_allocated``.
- host memory, of the machine = per process (the profile's ``host_baseline_bytes``, measured per device kind:
  Python, the libraries, CUDA's host side, a batch) + the policy's masters (pinned arenas count in full) + activation
  offload's block inputs + with optimizer offload the gradients and the optimizer's state, or the moment the masters
  are built while the loaded model still sits beside them, whichever is larger; times the processes on the machine;
  plus the EMA (``--ema_decay``: float32, the main process only). Where those processes share one host copy of the
  frozen weights (``--shared_host_weights``), the frozen masters count once for the machine, at their exact size,
  and no process builds an arena for them: ``processes x (baseline + private masters + ...) + shared copy``.
- step time = FLOPs at the profile's achieved rate, and copies at its achieved bandwidth (half of it from pageable
  memory, ``PAGEABLE_FACTOR``), overlapped as each policy overlaps them: prefetching offload and the H2D ring hide
  copies behind compute, classic block swap hides its loads but not its copies back, offload without prefetch hides
  nothing; an optimizer step on the host (``HOST_OPTIMIZER_VALUES_PER_SECOND``) and the EMA's copy of weights trained
  on the device are added, unhidden.

The dry runs behind a workload run a few blocks for all of them when its blocks are alike (``shallow.py``).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn

from ..offload_training.memory_buffer import align, tensor_nbytes
from .dry_run_cache import DryRunCache
from .footprint import StepFootprint, measure_step
from .profiles import GIB, DeviceProfile
from .residency import (
    OffloadSchedule,
    Residency,
    arena_bytes,
    classic_swap_residency,
    h2d_ring_residency,
    leaf_offload_host,
    simulate_leaf_offload,
    stream_sizes,
    swap_sizes,
)
from .shallow import Measured, extrapolated, shallow_depths
from .training_state import EMA_BYTES_PER_VALUE, TrainingSetup, optimizer_state

ALLOCATOR_SLACK = 0.08
"""Share of the allocated bytes the caching allocator holds on top, in partly used blocks (assumed)."""
HOST_OPTIMIZER_VALUES_PER_SECOND = 1e9
"""Trained values per second that an optimizer step on the host updates (optimizer offload; assumed: AdamW reads and
writes weight, gradient and two moments, some 14 bytes a value in bf16, at about 15 GB/s of host memory bandwidth)."""
PAGEABLE_FACTOR = 0.5
"""Share of the pinned bandwidth that copies from pageable memory achieve (through staging buffers; assumed)."""

CHECKPOINTING = ("off", "on", "offload")
"""Gradient checkpointing modes: none, ``--use_gradient_checkpointing``, ``--use_gradient_checkpointing_offload``."""
POLICIES = ("device", "classic", "h2d", "offload")
"""Where the weights live: all on the device, classic block swap, H2D-only streaming, per-leaf offload."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """One placement: a checkpointing mode and a policy with its settings."""

    checkpointing: str
    policy: str
    blocks_to_swap: int = 0
    ring_size: int = 2
    pinned: bool = True
    prefetch_depth: int = 1
    optimizer_offload: bool = False

    def describe(self) -> str:
        """A short name for tables, e.g. ``block swap 20 (pinned)``."""
        memory = "pinned" if self.pinned else "pageable"
        policy = {"device": "all on the GPU", "classic": f"block swap {self.blocks_to_swap} ({memory})",
                  "h2d": f"H2D ring {self.blocks_to_swap}/{self.ring_size} ({memory})",
                  "offload": f"model offload K={self.prefetch_depth}"}[self.policy]
        if self.optimizer_offload:
            policy += " + optimizer offload"
        return policy

    def flags(self) -> list[str]:
        """The trainer flags that select this plan."""
        flags = {"off": [], "on": ["--use_gradient_checkpointing"],
                 "offload": ["--use_gradient_checkpointing_offload"]}[self.checkpointing]
        if self.policy in ("classic", "h2d"):
            flags += ["--blocks_to_swap", str(self.blocks_to_swap)]
            flags += ["--use_pinned_memory_for_block_swap"] if self.pinned else []
        if self.policy == "h2d":
            flags += ["--block_swap_h2d_only", "--block_swap_ring_size", str(self.ring_size)]
        if self.policy == "offload":
            flags += ["--enable_model_cpu_offload", "--offload_prefetch_depth", str(self.prefetch_depth)]
            flags += ["--enable_optimizer_cpu_offload"] if self.optimizer_offload else []
        return flags


class Workload:
    """The denoiser of a run, on the meta device, and what a step of it saves, computes and moves per plan.

    Args:
        model: The denoiser built on the meta device, with its LoRA injected (trainable parameters as in the run).
        blocks: Its blocks in execution order, what block swap moves: every list it swaps, chained
            (``find_block_sequence``: FLUX's double then single blocks); counts and indices are over them all.
        step: Runs one forward on meta inputs of the run's shape and returns a scalar loss.
        set_checkpointing: Turns the blocks' gradient checkpointing on or off.
        other_model_sizes: Tensor sizes of the other models the stage runs each step (text encoder and VAE when
            training from raw samples); they follow the placement (offloaded with the denoiser, else on the device).
        description: What the workload is, for tables.
        local_processes: The run's processes on one machine (GPUs in use there); host memory is the machine's.
        shared_host_weights: Whether those processes share one host copy of the frozen weights that a policy keeps
            in host memory (``--shared_host_weights auto``).
        training: The optimizer, EMA and fused step of the run (``training_state.py``; None: AdamW, neither).
        dry_runs: Where the dry runs' results are kept between runs of the planner (``dry_run_cache.py``); None runs
            each (once per workload).
    """

    def __init__(self, model: nn.Module, blocks: Sequence[nn.Module], step: Callable[[], torch.Tensor],
                 set_checkpointing: Callable[[bool], None], other_model_sizes: Sequence[int] = (),
                 description: str = "", local_processes: int = 1, shared_host_weights: bool = True,
                 training: TrainingSetup | None = None, dry_runs: DryRunCache | None = None) -> None:
        if isinstance(local_processes, bool) or not isinstance(local_processes, int) or local_processes < 1:
            raise ValueError(f"local_processes={local_processes!r} must be the number of processes on a machine, "
                             "at least 1")
        self.model, self.blocks, self.step = model, blocks, step
        self.set_checkpointing = set_checkpointing
        self.other_model_sizes = list(other_model_sizes)
        self.description = description
        self.local_processes = local_processes
        self.shared_host_weights = shared_host_weights
        self.dry_runs = dry_runs or DryRunCache("", None)
        tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}.values()
        self.model_bytes = sum(tensor_nbytes(t) for t in tensors)
        trained = [p for p in model.parameters() if p.requires_grad]
        self.trainable_bytes = sum(tensor_nbytes(p) for p in trained)
        self.largest_trainable_bytes = max((tensor_nbytes(p) for p in trained), default=0)
        self.trained_values = sum(p.numel() for p in trained)
        self._set_training(training or TrainingSetup())
        self.frozen_base = not any(p.requires_grad for name, p in model.named_parameters() if "lora_" not in name)
        self.swap_sizes, self.stream_sizes = swap_sizes(blocks), stream_sizes(blocks)
        self._depths = shallow_depths(model, blocks)
        self._footprints: dict[bool, StepFootprint] = {}
        self._residencies: dict[Plan, Residency | None] = {}

    def _set_training(self, training: TrainingSetup) -> None:
        self.training = training
        self.optimizer = optimizer_state(training.optimizer)
        self.optimizer_state_bytes = self.optimizer.bytes_for((p.numel(), p.element_size())
                                                              for p in self.model.parameters() if p.requires_grad)
        self.ema_bytes = EMA_BYTES_PER_VALUE * self.trained_values if training.ema else 0

    def with_training(self, training: TrainingSetup) -> Workload:
        """This workload with another optimizer, EMA or fused step; the dry runs, which none of them changes, are
        shared with it."""
        other = copy.copy(self)
        other._set_training(training)
        return other

    def footprint(self, checkpointing: bool) -> StepFootprint:
        """Saved bytes, per-block activations and FLOPs of one step (a dry run, done once per mode)."""
        if checkpointing not in self._footprints:
            self._footprints[checkpointing] = self._dry_run(
                f"footprint-checkpointing-{checkpointing}", StepFootprint, checkpointing,
                lambda blocks: measure_step(self.model, self.step, blocks))
        return self._footprints[checkpointing]

    def _dry_run(self, name: str, kind: type, checkpointing: bool,
                 measure: Callable[[Sequence[nn.Module]], Measured]) -> Measured:
        """``measure`` with checkpointing set, kept in ``dry_runs`` as ``name`` (a dataclass ``kind``)."""
        def run() -> Measured:
            self.set_checkpointing(checkpointing)
            # Shallow runs stand for the whole model when its blocks are alike (shallow.py); else every block runs.
            if self._depths is None:
                return measure(self.blocks)
            return extrapolated(measure, self.model, self._depths)

        return self.dry_runs.result(name, kind, run)

    def residency(self, plan: Plan) -> Residency | None:
        """The policy's moving weights (computed once per plan); None for ``device``: nothing moves."""
        if plan.checkpointing == "offload":
            # Activation offload moves block inputs, not weights: the schedule is checkpointing's.
            plan = dataclasses.replace(plan, checkpointing="on")
        if plan not in self._residencies:
            self._residencies[plan] = self._residency(plan)
        return self._residencies[plan]

    def _residency(self, plan: Plan) -> Residency | None:
        checkpointing = plan.checkpointing != "off"
        if plan.policy == "classic":
            return classic_swap_residency(self.swap_sizes, plan.blocks_to_swap, checkpointing, plan.pinned,
                                          self.model_bytes)
        if plan.policy == "h2d":
            return h2d_ring_residency(self.stream_sizes, plan.blocks_to_swap, plan.ring_size, plan.pinned,
                                      self.model_bytes)
        if plan.policy == "offload":
            schedule = self._dry_run(
                f"offload-checkpointing-{checkpointing}-prefetch-{plan.prefetch_depth}"
                f"-optimizer-{plan.optimizer_offload}", OffloadSchedule, checkpointing,
                lambda blocks: simulate_leaf_offload(self.model, self.step, plan.prefetch_depth,
                                                     plan.optimizer_offload))
            return leaf_offload_host(self.model, schedule, plan.optimizer_offload)
        return None


@dataclasses.dataclass
class Prediction:
    """What one plan is predicted to cost.

    Attributes:
        plan: The plan.
        device_bytes: Peak device memory, context and allocator slack included.
        allocated_bytes: Peak bytes of tensors on the device (``torch.cuda.max_memory_allocated``).
        host_bytes: Peak host memory of one machine: its processes, and the host copy they share if they do.
        shared_host_bytes: The shared host copy within it (counted once); 0 without one.
        step_seconds: One training step.
        compute_seconds: Its compute alone.
        transfer_seconds: Its weight and activation copies alone.
        parts: The device memory by component, in bytes.
    """

    plan: Plan
    device_bytes: int
    allocated_bytes: int
    host_bytes: int
    step_seconds: float
    compute_seconds: float
    transfer_seconds: float
    parts: dict[str, int]
    shared_host_bytes: int = 0
    host_parts: dict[str, int] = dataclasses.field(default_factory=dict)

    def fits(self, vram_bytes: float, ram_bytes: float) -> bool:
        return self.device_bytes <= vram_bytes and self.host_bytes <= ram_bytes


def predict(plan: Plan, workload: Workload, profile: DeviceProfile) -> Prediction:
    """Predicts the peak device memory, peak host memory and step time of ``plan`` on ``profile``."""
    checkpointing = plan.checkpointing != "off"
    footprint, unchecked = workload.footprint(checkpointing), workload.footprint(False)
    offloaded_inputs = sum(footprint.block_input_bytes) if plan.checkpointing == "offload" else 0
    # In backward, gradients as large as the largest saved tensor live beside it; under checkpointing the block
    # being differentiated holds its recomputed activations too.
    working = 2 * unchecked.largest_saved_bytes + (max(unchecked.block_saved_bytes, default=0) if checkpointing else 0)
    activations = footprint.saved_bytes - offloaded_inputs + working
    residency = workload.residency(plan)
    trainable = workload.trainable_bytes
    on_host = plan.policy != "device"
    # Trained weights stay on the device with their gradients and optimizer state, unless the optimizer is offloaded:
    # then the weights are among the moving weights, and state and gradients are kept on the host. Each gradient
    # crosses the device on its way there, and the fused step frees each as soon as its weight is updated.
    trained_on_host = plan.optimizer_offload
    resident_trainable = 0 if trained_on_host else trainable
    one_gradient_at_a_time = trained_on_host or workload.training.fused_step
    gradients = workload.largest_trainable_bytes if one_gradient_at_a_time else trainable
    parts = {"weights": workload.model_bytes - resident_trainable - (residency.offloaded_bytes if residency else 0),
             "moving weights": residency.peak_bytes if residency else 0,
             "trained weights": resident_trainable,
             "gradients": gradients,
             "optimizer state": 0 if trained_on_host else workload.optimizer_state_bytes,
             "activations": activations,
             "other models": 0 if plan.policy == "offload" else sum(workload.other_model_sizes)}
    allocated = sum(parts.values())
    parts["CUDA context + slack"] = profile.context_bytes + int(ALLOCATOR_SLACK * allocated)
    sharing = on_host and workload.local_processes > 1 and workload.shared_host_weights
    masters, building = 0, 0
    if residency is not None:
        masters = residency.private_host_bytes if sharing else residency.host_bytes
        building = residency.private_build_peak_bytes if sharing else residency.build_peak_bytes
    host_steady = masters + offloaded_inputs
    if trained_on_host:  # the gradients copied back (beside their staging in the arena) and the optimizer state
        host_steady += (workload.largest_trainable_bytes if workload.training.fused_step else trainable)
        host_steady += workload.optimizer_state_bytes
    shared = residency.shared_bytes if sharing else 0
    if plan.policy == "offload" and sharing:
        shared += sum(align(size) for size in workload.other_model_sizes)
    elif plan.policy == "offload":
        host_steady += arena_bytes(workload.other_model_sizes, pinned=True)
    # The EMA lives in the main process only: once per machine.
    host = (workload.local_processes * (profile.host_baseline_bytes + max(host_steady, building)) + shared
            + workload.ema_bytes)
    bandwidth = profile.bytes_per_second * (1.0 if plan.pinned or plan.policy == "offload" else PAGEABLE_FACTOR)
    compute = footprint.flops / profile.flops_per_second
    loads = (residency.moved_bytes if residency else 0) + offloaded_inputs * 2
    returns = (residency.returned_bytes if residency else 0) + (trainable if trained_on_host else 0)
    transfer = (loads + returns) / bandwidth
    if plan.policy == "classic":
        step = max(compute, loads / bandwidth) + returns / bandwidth
    elif plan.policy == "offload" and plan.prefetch_depth == 0:
        step = compute + transfer
    else:
        step = max(compute, transfer)
    if trained_on_host:  # the host runs the optimizer, after (or, fused, inside) backward: not hidden
        step += workload.trained_values / HOST_OPTIMIZER_VALUES_PER_SECOND
    if workload.ema_bytes and not trained_on_host:  # the EMA reads the trained weights from the device each step
        step += trainable / (profile.bytes_per_second * PAGEABLE_FACTOR)
    host_parts = {"baseline": profile.host_baseline_bytes, "training": host_steady, "building": building,
                  "shared copy": shared, "EMA": workload.ema_bytes}
    return Prediction(plan, allocated + parts["CUDA context + slack"], allocated, host, step, compute, transfer,
                      parts, shared, host_parts)


def candidate_plans(workload: Workload, checkpointing: Iterable[str] = CHECKPOINTING,
                    policies: Iterable[str] = POLICIES) -> list[Plan]:
    """Every plan worth predicting: each checkpointing mode with every policy and every block count.

    H2D streaming needs a frozen base and checkpointing; classic block swap needs frozen weights in the blocks (it
    leaves trained ones on the device); neither runs with the fused step. A full fine-tune is planned with and without
    optimizer offload.
    """
    plans, policies = [], set(policies)
    swapping = not workload.training.fused_step
    classic = "classic" in policies and swapping and any(sum(sizes) for sizes in workload.swap_sizes)
    h2d = "h2d" in policies and swapping and workload.frozen_base
    for mode in checkpointing:
        if "device" in policies:
            plans.append(Plan(mode, "device"))
        for count in range(1, len(workload.blocks) + 1):
            for pinned in (True, False):
                if classic:
                    plans.append(Plan(mode, "classic", count, pinned=pinned))
                if h2d and mode != "off":
                    plans.append(Plan(mode, "h2d", count, pinned=pinned))
        if "offload" in policies:
            plans += [Plan(mode, "offload", optimizer_offload=offloaded)
                      for offloaded in ([False] if workload.frozen_base else [False, True])]
    return plans


class NoPlanFits(ValueError):
    """No plan fits the budgets; the message says the smallest budgets that would and what to change."""


def _preference(prediction: Prediction) -> tuple[float, float, int]:
    # Fastest first; among plans equally fast (copies hidden behind compute) the one that copies least, so that a
    # slower link than predicted costs least, then the least host memory.
    return round(prediction.step_seconds, 2), prediction.transfer_seconds, prediction.host_bytes


def choose(predictions: Sequence[Prediction], vram_bytes: float, ram_bytes: float,
           full_training: bool = False) -> Prediction:
    """The fastest prediction that fits both budgets (among equally fast ones, the one that copies least).

    ``full_training``: the run trains whole weights, so the message names the options that keep less beside them.

    Raises:
        NoPlanFits: None fits; the message names the smallest device and host budgets that would fit some plan.
    """
    fitting = [p for p in predictions if p.fits(vram_bytes, ram_bytes)]
    if fitting:
        return min(fitting, key=_preference)
    within_ram = [p for p in predictions if p.host_bytes <= ram_bytes]
    lines = [(f"no placement fits {vram_bytes / GIB:.1f} GiB of device memory and {ram_bytes / GIB:.1f} GiB of host "
             "memory.")]
    if within_ram:
        best = min(within_ram, key=lambda p: p.device_bytes)
        lines.append(f"The least device memory within the host budget: {best.device_bytes / GIB:.1f} GiB with "
                     f"{best.plan.describe()}, checkpointing {best.plan.checkpointing} ({' '.join(best.plan.flags())}); "
                     f"raise --vram_budget to at least {best.device_bytes / GIB:.1f}.")
    least_host = min(predictions, key=lambda p: (not p.device_bytes <= vram_bytes, p.host_bytes))
    if least_host.device_bytes <= vram_bytes:
        lines.append(f"Within the device budget, {least_host.plan.describe()} needs {least_host.host_bytes / GIB:.1f} "
                     "GiB of host memory; raise --ram_budget to that.")
    lines.append("Or lower the activation memory: a smaller --max_pixels (or --height/--width, --num_frames), or the "
                 "weights: --fp8_models for the frozen transformer, a LoRA instead of --trainable_models.")
    if full_training:
        lines.append("A full fine-tune also keeps less with --customized_optimizer bitsandbytes.optim.AdamW8bit (a "
                     "quarter of AdamW's float32 state, half of its bf16 state) and --fused_optimizer_step (no full "
                     "set of gradients).")
    raise NoPlanFits(" ".join(lines))


def best_per_group(predictions: Sequence[Prediction], vram_bytes: float, ram_bytes: float) -> list[Prediction]:
    """One row per checkpointing mode and policy: its fastest fitting plan, else its least device memory one."""
    groups: dict[tuple[str, str], list[Prediction]] = {}
    for prediction in predictions:
        groups.setdefault((prediction.plan.checkpointing, prediction.plan.policy), []).append(prediction)
    rows = []
    for members in groups.values():
        fitting = [p for p in members if p.fits(vram_bytes, ram_bytes)]
        rows.append(min(fitting, key=_preference) if fitting
                    else min(members, key=lambda p: p.device_bytes))
    return rows


def format_table(rows: Sequence[Prediction], vram_bytes: float, ram_bytes: float,
                 chosen: Prediction | None = None) -> str:
    """A Markdown table of predictions: plan, device and host memory, step time, whether it fits."""
    lines = ["| checkpointing | placement | GPU GiB | host GiB | step s | fits |", "| --- | --- | ---: | ---: | ---: | --- |"]
    for row in sorted(rows, key=lambda p: (CHECKPOINTING.index(p.plan.checkpointing), POLICIES.index(p.plan.policy))):
        mark = "chosen" if row is chosen else ("yes" if row.fits(vram_bytes, ram_bytes) else "no")
        lines.append(f"| {row.plan.checkpointing} | {row.plan.describe()} | {row.device_bytes / GIB:.1f} | "
                     f"{row.host_bytes / GIB:.1f} | {row.step_seconds:.2f} | {mark} |")
    return "\n".join(lines)
