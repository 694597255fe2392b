"""The memory planner for a training run: from its flags, before any weight is loaded, the placement that fits.

``plan_placement`` (the trainer, with ``--vram_budget`` / ``--ram_budget``) and ``python -m diffsynth.plan`` build the
run's denoiser without weights on the meta device, inject its LoRA, give it inputs of the largest sample the flags
allow, and predict every candidate placement (``core/planning``). With budgets the fastest plan that fits both is
chosen, or the run stops before loading with the budgets that would fit and what to change; placement flags given
explicitly (``--enable_model_cpu_offload``, ``--blocks_to_swap``) win, and are only predicted and warned about.

What the predictions assume about the data: ``--batch_size`` samples per micro-batch, each of the fixed ``--height``
x ``--width`` or else the square of ``--max_pixels`` (no aspect-ratio bucket is larger); ``--num_frames`` for video;
prompts of the family's ``prompt_tokens`` tokens.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ...core.device import available_host_memory
from ...core.fp8 import enable_fp8_storage
from ...core.gradient import gradient_checkpoint_forward
from ...core.loader import (
    ModelConfig,
    ModelFilesNotFoundError,
    ModelLoadError,
    load_skeleton,
    parse_model_configs,
    parse_model_id_with_origin_paths,
    resolve_files,
)
from ...core.loader.loading import library_class, resolve_dtype
from ...core.offload_training.block_swap import BlockSequence, find_block_sequence
from ...core.offload_training.memory_buffer import tensor_nbytes
from ...core.planning.dry_run_cache import DryRunCache, cache_folder, workload_fingerprint
from ...core.planning.plans import (
    CHECKPOINTING,
    POLICIES,
    NoPlanFits,
    Plan,
    Prediction,
    Workload,
    best_per_group,
    candidate_plans,
    choose,
    format_table,
    predict,
)
from ...core.planning.profiles import GIB, DeviceProfile, measure_device
from ...core.planning.training_state import TrainingSetup
from ...pipelines.registry import families, family_of_class, load, releases
from ..config.errors import FlagError
from ..config.placement import PlacementConfig
from ..objective.adapter import AdapterSettings, inject_adapter
from ..objective.lora_targets import TargetAliases, resolve_lora_targets, scoped_targets

if TYPE_CHECKING:
    from ..config import RunConfig
    from ..config.dataset import DatasetSection
    from ..config.model import ModelSection

logger = logging.getLogger(__name__)

HOST_MARGIN_BYTES = 2 * GIB
"""Host memory left to the system and other processes by ``--ram_budget auto``."""
DEVICE_MARGIN_BYTES = GIB // 2
"""Device memory left free by ``--vram_budget auto``."""


def repo_files_missing(model: ModelSection) -> list[ModelConfig]:
    """The entries of ``--model_id_with_origin_paths`` whose files are not on disk, found without downloading."""
    if not model.model_id_with_origin_paths:
        return []
    missing = []
    for config in parse_model_id_with_origin_paths(model.model_id_with_origin_paths):
        try:
            resolve_files(dataclasses.replace(config, skip_download=True))
        except ModelFilesNotFoundError:
            missing.append(config)
    return missing


def build_architecture(name: str, dtype: torch.dtype | str) -> nn.Module:
    """The denoiser of a released model (``pipelines.registry.releases()``) on the meta device."""
    spec, release = releases()[name]
    spec.pipeline_class()  # a room registers its own model classes (Wan Fun's) when its pipeline is imported
    cls = library_class("diffusers", release.denoiser_class or spec.denoiser_class, f"release {name}")
    with torch.device("meta"):
        model = cls(**release.config)
    return model.to(resolve_dtype(dtype)).eval()


def sample_shape(dataset: DatasetSection) -> tuple[int, int, int]:
    """``(height, width, frames)`` of the largest sample the flags allow (frames 1 for images)."""
    if dataset.height is not None:
        height, width = dataset.height, dataset.width
    else:
        height = width = max(16, int(math.sqrt(dataset.max_pixels)) // 16 * 16)
    return height, width, dataset.num_frames or 1


def denoiser_inputs(model: nn.Module, height: int, width: int, frames: int, dtype: torch.dtype,
                    batch: int = 1) -> dict[str, Any]:
    """The keyword inputs the pipeline passes the denoiser for a batch of ``batch`` samples of this shape, on the meta
    device, as the denoiser's family declares them (``FamilySpec.planner_inputs``), with its prompt length.

    Raises:
        ValueError: A denoiser class no family declares.
    """
    name = type(model).__name__
    spec = family_of_class(name)
    if spec is None:
        planned = ", ".join(sorted(family.denoiser_class for family in families()))
        raise ValueError(f"the memory planner has no inputs for {name}; it plans {planned}")
    return load(spec.planner_inputs)(model, height, width, frames, dtype, batch, spec.prompt_tokens)


def build_workload(model: nn.Module, run: RunConfig, other_model_sizes: Sequence[int] = (),
                   aliases: TargetAliases | None = None, description: str = "", fp8: bool = False,
                   local_processes: int = 1, scope: Any = None) -> Workload:
    """The run's denoiser as a ``Workload``: its LoRA injected as the trainer does (float32, trainable), or trained
    in full with ``--trainable_models``, its frozen Linear weights in fp8 with ``fp8`` (``--fp8_models``), and a step
    on a ``--batch_size`` batch of the largest sample; host memory for ``local_processes`` on a machine, sharing one
    host copy of the frozen weights unless ``--shared_host_weights off``; the optimizer's state by
    ``--customized_optimizer``, the EMA with ``--ema_decay``, gradients one at a time with
    ``--fused_optimizer_step``. ``scope`` is the pipeline's ``part_scope``: what a model part (Wan VACE's
    ``vace``) trains of the denoiser."""
    dtype = resolve_dtype(run.model.torch_dtype)
    model.to("meta")  # a skeleton from the model files keeps its small buffers (RoPE tables) on the CPU
    model.requires_grad_(False)
    if run.lora.lora_base_model:
        parts = scope(run.lora.lora_base_model, model) if scope is not None else ((), ())
        targets = resolve_lora_targets(model, run.lora.targets, aliases or {}, run.lora.lora_base_model, parts)
        targets = scoped_targets(model, targets, *parts)
        settings = AdapterSettings(run.lora.lora_type, run.lora.lora_rank, run.lora.lora_alpha or run.lora.lora_rank,
                                   run.lora.use_dora, run.lora.lokr_factor)
        with torch.device("meta"):  # adapter weights made where they go: nothing is initialised on the CPU first
            inject_adapter(model, settings, targets)  # its trainable weights (LoHa, LoKr, DoRA's too) counted here
    else:
        model.requires_grad_(True)
        scopes = [scope(name, model) for name in run.training.trainable] if scope is not None else []
        if any(inside for inside, _ in scopes):  # a model part alone (Wan VACE's vace): the rest stays frozen
            model.requires_grad_(False)
        for inside, outside in scopes:
            for child in inside:
                model.get_submodule(child).requires_grad_(True)
            for child in outside:
                model.get_submodule(child).requires_grad_(False)
    if fp8:
        enable_fp8_storage(model)
    inputs = denoiser_inputs(model, *sample_shape(run.dataset), dtype, batch=run.dataset.batch_size)

    def set_checkpointing(enabled: bool) -> None:
        if enabled:
            model.enable_gradient_checkpointing(gradient_checkpointing_func=_checkpoint_block)
        else:
            model.disable_gradient_checkpointing()

    def step() -> torch.Tensor:
        prediction = model(**inputs)[0]
        if isinstance(prediction, list):  # a denoiser that predicts one tensor per sample
            prediction = torch.stack(prediction)
        return prediction.float().square().mean()

    # Every block list block swap would swap (double then single blocks, where there are two), as one sequence.
    training = TrainingSetup(run.training.customized_optimizer, run.training.ema_decay is not None,
                             run.training.fused_optimizer_step)
    folder = cache_folder()
    dry_runs = DryRunCache(workload_fingerprint(model, inputs.items()) if folder else "", folder)
    return Workload(model, _block_sequence(model), step, set_checkpointing, other_model_sizes, description,
                    local_processes, run.placement.shared_host_weights == "auto", training, dry_runs)


def _block_sequence(model: nn.Module) -> BlockSequence:
    """The blocks block swap would swap; none for a denoiser whose family declares no block swap (a UNet), whose
    plans then keep it whole."""
    spec = family_of_class(type(model).__name__)
    if spec is not None and not spec.block_swap:
        return BlockSequence((), (), ())
    return find_block_sequence(model)


def _checkpoint_block(block: nn.Module, *args: Any, **kwargs: Any) -> Any:
    # The dry run checkpoints as the trainer does; activation offload is predicted from it (meta has no host copy).
    return gradient_checkpoint_forward(block, True, False, *args, **kwargs)


def plan_modes(placement: PlacementConfig) -> tuple[list[str], list[str]]:
    """The checkpointing modes and policies the planner may pick: the flags' own when given explicitly."""
    if placement.use_gradient_checkpointing_offload:
        modes = ["offload"]
    elif placement.use_gradient_checkpointing:
        modes = ["on"]
    else:
        modes = list(CHECKPOINTING)
    if placement.enable_model_cpu_offload:
        policies = ["offload"]
    elif placement.blocks_to_swap:
        policies = ["h2d" if placement.block_swap_h2d_only else "classic"]
    else:
        policies = list(POLICIES)
    return modes, policies


def explicit_plan(placement: PlacementConfig) -> Plan | None:
    """The plan the placement flags name, when they name one (offload or block swap); None leaves it to the planner."""
    mode = ("offload" if placement.use_gradient_checkpointing_offload
            else "on" if placement.use_gradient_checkpointing else "off")
    if placement.enable_model_cpu_offload:
        depth = 1 if placement.offload_prefetch_depth is None else placement.offload_prefetch_depth
        return Plan(mode, "offload", prefetch_depth=depth, optimizer_offload=placement.enable_optimizer_cpu_offload)
    if placement.blocks_to_swap:
        return Plan(mode, "h2d" if placement.block_swap_h2d_only else "classic", placement.blocks_to_swap,
                    placement.block_swap_ring_size, placement.use_pinned_memory_for_block_swap)
    return None


def apply_plan(placement: PlacementConfig, plan: Plan) -> PlacementConfig:
    """``placement`` with the flags of ``plan``."""
    return dataclasses.replace(
        placement, use_gradient_checkpointing=plan.checkpointing == "on",
        use_gradient_checkpointing_offload=plan.checkpointing == "offload",
        enable_model_cpu_offload=plan.policy == "offload",
        enable_optimizer_cpu_offload=plan.policy == "offload" and plan.optimizer_offload,
        offload_prefetch_depth=plan.prefetch_depth if plan.policy == "offload" else None,
        blocks_to_swap=plan.blocks_to_swap if plan.policy in ("classic", "h2d") else 0,
        block_swap_h2d_only=plan.policy == "h2d", block_swap_ring_size=plan.ring_size,
        use_pinned_memory_for_block_swap=plan.policy in ("classic", "h2d") and plan.pinned)


def budget_bytes(value: str | None, flag: str, available: int | None) -> float:
    """A budget flag's bytes: a size in GB (GiB, 2^30 bytes), ``auto`` (``available``), or unbounded when unset.

    Raises:
        FlagError: ``auto`` where nothing can be measured.
    """
    if value is None:
        return math.inf
    if value == "auto":
        if available is None:
            raise FlagError([f"--{flag} auto measures the CUDA device's free memory, but this machine has none; pass "
                             f"a size in GB (--{flag} 24), or plan for a card you do not have with python -m "
                             "diffsynth.plan --device_profile NAME"])
        return available
    return float(value) * GIB


def available_host_bytes() -> float:
    """Host memory available to the run (the kernel's figure, or the container's limit when smaller), less
    ``HOST_MARGIN_BYTES``; unbounded where the platform does not tell (no ``/proc/meminfo``)."""
    available = available_host_memory()
    return math.inf if available is None else available - HOST_MARGIN_BYTES


@dataclasses.dataclass
class PlanReport:
    """What the planner found: the chosen prediction (or the explicit one), the table, the budgets."""

    chosen: Prediction
    rows: list[Prediction]
    vram_bytes: float
    ram_bytes: float
    profile: DeviceProfile
    explicit: bool

    def format(self) -> str:
        head = (f"memory plan on {self.profile.name} ({self.profile.tflops:g} TFLOPS x "
                f"{self.profile.compute_efficiency:g}, {self.profile.h2d_gbps:g} GB/s x "
                f"{self.profile.link_efficiency:g}); budgets: device {_gib(self.vram_bytes)}, host {_gib(self.ram_bytes)}")
        return head + "\n" + format_table(self.rows, self.vram_bytes, self.ram_bytes, self.chosen)


def _gib(value: float) -> str:
    return "unbounded" if value == math.inf else f"{value / GIB:.1f} GiB"


def plan_workload(workload: Workload, placement: PlacementConfig, profile: DeviceProfile, vram_bytes: float,
                  ram_bytes: float) -> PlanReport:
    """Predicts the candidate plans of ``workload`` and picks one (or predicts the placement flags' own).

    Raises:
        NoPlanFits: No candidate fits the budgets.
    """
    explicit = explicit_plan(placement)
    modes, policies = plan_modes(placement)
    predictions = [predict(plan, workload, profile) for plan in candidate_plans(workload, modes, policies)]
    if explicit is not None:
        chosen = predict(explicit, workload, profile)
        predictions = [p for p in predictions if p.plan != explicit] + [chosen]
    else:
        chosen = choose(predictions, vram_bytes, ram_bytes, full_training=not workload.frozen_base)
    rows = best_per_group(predictions, vram_bytes, ram_bytes)
    rows = [chosen if row.plan == chosen.plan else row for row in rows]
    if chosen not in rows:
        rows = [row for row in rows if (row.plan.checkpointing, row.plan.policy)
                != (chosen.plan.checkpointing, chosen.plan.policy)] + [chosen]
    return PlanReport(chosen, rows, vram_bytes, ram_bytes, profile, explicit is not None)


def denoiser_skeleton(run: RunConfig, pipeline_class: Any,
                      download: bool = True) -> tuple[nn.Module, list[int], bool]:
    """The denoiser on the meta device from the model files' configs, the tensor sizes of the other models the stage
    runs each step (none when training from a stage-1 cache), and whether ``--fp8_models`` names the denoiser.

    Args:
        run: The run's flags.
        pipeline_class: Its pipeline, which names the denoiser's class.
        download: Download missing model files (the trainer, which loads them next); ``False`` only reads the disk.

    Raises:
        FlagError: No denoiser among the models.
        ModelFilesNotFoundError: A model's files are missing (and not downloaded).
    """
    configs = parse_model_configs(run.model.model_paths, run.model.model_id_with_origin_paths)
    weightless = parse_model_id_with_origin_paths(run.model.offload_models) if run.model.offload_models else []
    fp8 = parse_model_id_with_origin_paths(run.model.fp8_models) if run.model.fp8_models else []
    denoiser, others, denoiser_fp8 = None, [], False
    for config in configs:
        try:
            skeleton = load_skeleton(config if download else dataclasses.replace(config, skip_download=True),
                                     torch_dtype=run.model.torch_dtype)
        except ModelLoadError:
            continue  # a tokenizer folder
        role = pipeline_class.model_roles.get(type(skeleton).__name__)
        if role in pipeline_class.denoising_model_names and denoiser is None:
            denoiser, denoiser_fp8 = skeleton, config in fp8
        elif config not in weightless and run.training.stage != "train":
            others += [tensor_nbytes(t) for t in {id(t): t for t in [*skeleton.parameters(),
                                                                      *skeleton.buffers()]}.values()]
    if denoiser is None:
        raise FlagError([f"the memory planner found no denoiser ({', '.join(pipeline_class.denoising_model_names)}) "
                         "among --model_id_with_origin_paths / --model_paths; it plans the model that trains"])
    return denoiser, others, denoiser_fp8


def plan_placement(run: RunConfig, pipeline_class: Any, device: torch.device,
                   local_processes: int = 1) -> PlacementConfig:
    """The trainer's planning step (with ``--vram_budget`` or ``--ram_budget``): logs the table and returns the
    placement of the chosen plan, or the run's own when its flags name one (warning if it exceeds a budget).

    The device's rates are measured first. On the CPU (tests) it plans with the CPU's figures, and a budget counts the
    "device" bytes the plan would put on a GPU. ``--ram_budget`` is the machine's: the host memory of its
    ``local_processes`` together.

    Raises:
        FlagError: No plan fits, or ``--vram_budget auto`` without a CUDA device; before any weight is loaded.
    """
    placement, cuda = run.placement, device.type == "cuda"
    vram = budget_bytes(placement.vram_budget, "vram_budget",
                        torch.cuda.mem_get_info(device)[0] - DEVICE_MARGIN_BYTES if cuda else None)
    ram = budget_bytes(placement.ram_budget, "ram_budget", available_host_bytes())
    model, others, fp8 = denoiser_skeleton(run, pipeline_class)
    workload = build_workload(model, run, others, pipeline_class.lora_target_aliases,
                              scope=pipeline_class.part_scope, fp8=fp8,
                              local_processes=local_processes)
    try:
        report = plan_workload(workload, placement, measure_device(device), vram, ram)
    except NoPlanFits as error:
        raise FlagError([f"--vram_budget {placement.vram_budget} / --ram_budget {placement.ram_budget}: {error}"]) \
            from None
    logger.info("%s", report.format())
    chosen = report.chosen
    if report.explicit:
        if not chosen.fits(vram, ram):
            logger.warning("the placement flags given are predicted to need %.1f GiB of device and %.1f GiB of host "
                           "memory, over the budget; drop them to let the planner choose", chosen.device_bytes / GIB,
                           chosen.host_bytes / GIB)
        return placement
    logger.info("planner: %s, checkpointing %s (the flags %s)", chosen.plan.describe(), chosen.plan.checkpointing,
                " ".join(chosen.plan.flags()) or "none")
    return apply_plan(placement, chosen.plan)
