"""What the runner does differently when accelerate runs DeepSpeed (ZeRO-3 with CPU offload, the low-VRAM recipe).

DeepSpeed owns placement and the optimizer step: the training module is prepared together with its optimizer, ZeRO-3
partitions every parameter across processes (and into CPU memory with ``offload_param``), and the weights must be
gathered before they are saved. PyTorch's own checkpointing does not see partitioned parameters, so blocks are
checkpointed through DeepSpeed's checkpoint once it is configured from the ``activation_checkpointing`` section.
DeepSpeed is optional: nothing here imports it unless the run uses it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..config.errors import FlagError
from ..config.quant_flags import packed_weights_flag
from ..objective.training_module import DiffusionTrainingModule

if TYPE_CHECKING:
    from ..config.model import ModelSection
    from ..config.placement import PlacementConfig
    from ..config.training import TrainingSection
    from ..config.validation import ValidationSection

logger = logging.getLogger(__name__)


def deepspeed_config(accelerator: Any) -> dict | None:
    """The DeepSpeed config of the run, or None when accelerate does not run DeepSpeed."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return None if plugin is None else plugin.deepspeed_config


def set_micro_batch_size(accelerator: Any, batch_size: int) -> None:
    """Gives DeepSpeed the run's ``--batch_size`` where its config leaves the micro-batch to accelerate (``auto``).

    accelerate fills ``auto`` from the dataloader's ``batch_size``, which is None for the trainer's bucket batch
    sampler; a number the config gives is kept.
    """
    config = deepspeed_config(accelerator)
    if config is not None and config.get("train_micro_batch_size_per_gpu", "auto") == "auto":
        config["train_micro_batch_size_per_gpu"] = batch_size


def match_gradient_clipping(config: dict, max_grad_norm: float | None) -> None:
    """Makes DeepSpeed clip as ``--max_grad_norm`` asks, where the config leaves it to accelerate (``auto``).

    DeepSpeed clips inside its own step, so the trainer's clipping does nothing under it, and accelerate fills an
    ``auto`` ``gradient_clipping`` with 1.0. The flag's norm replaces ``auto``; without the flag the 1.0 stays, as in
    the reference's DeepSpeed runs, and is logged, since a run without DeepSpeed clips nothing by default.

    Raises:
        FlagError: The config gives a number other than ``--max_grad_norm`` (:func:`gradient_clipping_problems`).
    """
    if problems := gradient_clipping_problems(config, max_grad_norm):
        raise FlagError(problems)
    if config.get("gradient_clipping", "auto") == "auto":
        if max_grad_norm is None:
            logger.info("DeepSpeed clips gradients at norm 1.0 (gradient_clipping auto in its config); pass "
                        "--max_grad_norm to choose the norm, or set gradient_clipping to 0 to clip nothing")
        else:
            config["gradient_clipping"] = max_grad_norm


def gradient_clipping_problems(config: dict, max_grad_norm: float | None) -> list[str]:
    """``--max_grad_norm`` against the DeepSpeed config's ``gradient_clipping``: a number other than the flag's is
    refused, since DeepSpeed clips by its config."""
    configured = config.get("gradient_clipping", "auto")
    if configured == "auto" or max_grad_norm is None or float(configured) == max_grad_norm:
        return []
    return [f"--max_grad_norm {max_grad_norm:g} but the DeepSpeed config sets gradient_clipping {configured}, and "
            f"DeepSpeed clips by its config; set gradient_clipping to \"auto\" (or {max_grad_norm:g}) in the config, "
            "or drop --max_grad_norm"]


def initialize_deepspeed_gradient_checkpointing(accelerator: Any) -> bool:
    """Configures DeepSpeed's activation checkpointing from the config's ``activation_checkpointing`` section.

    Once configured, ``gradient_checkpoint_forward`` checkpoints through DeepSpeed. Without the section, blocks are
    not checkpointed under ZeRO-3 (torch's checkpoint would re-gather partitioned weights wrongly), which is logged.

    Returns:
        Whether checkpointing was configured.
    """
    config = deepspeed_config(accelerator)
    if config is None:
        return False
    section = config.get("activation_checkpointing")
    if section is None:
        logger.warning("the DeepSpeed config has no activation_checkpointing section, so blocks are not "
                       "checkpointed; add one to use --use_gradient_checkpointing with DeepSpeed")
        return False
    import deepspeed

    deepspeed.checkpointing.configure(
        mpu_=None, partition_activations=section.get("partition_activations", False),
        checkpoint_in_cpu=section.get("cpu_checkpointing", False),
        contiguous_checkpointing=section.get("contiguous_memory_optimization", False),
    )  # fmt: skip
    return True


def release_unused_models(module: DiffusionTrainingModule) -> list[str]:
    """Drops the pipeline's models that this stage never computes with, so ZeRO does not partition them.

    Skeletons from ``--offload_models`` (weights on the meta device) would make DeepSpeed fail outright.

    Returns:
        The names of the released models.
    """
    active = set(module.active_model_names())
    released = [name for name, child in module.pipe.named_children() if name not in active]
    for name in released:
        setattr(module.pipe, name, None)
    if released:
        logger.info("released models this stage never runs before DeepSpeed partitions the rest: %s", released)
    return released


@contextlib.contextmanager
def gathered_parameters(params: Sequence[torch.nn.Parameter]) -> Iterator[None]:
    """Makes ZeRO-3 partitioned ``params`` whole for the duration (a collective: every process must enter)."""
    if not any(hasattr(param, "ds_id") for param in params):
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(params), modifier_rank=None):
        yield


@contextlib.contextmanager
def without_zero3_init(accelerator: Any) -> Iterator[None]:
    """Builds models whole while accelerate runs ZeRO-3.

    transformers would otherwise construct every model inside ZeRO-3's partitioning init, which cannot take the
    loader's meta-device build; the weights are loaded whole on the CPU and partitioned when the training module is
    prepared. A no-op without DeepSpeed.
    """
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is None:
        yield
        return
    from transformers.integrations import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        plugin.set_deepspeed_weakref()


def deepspeed_problems(placement: PlacementConfig, model: ModelSection, validation: ValidationSection,
                       training: TrainingSection) -> list[str]:
    """The flags that cannot work when accelerate runs DeepSpeed, each with its fix."""
    problems = []
    if placement.enable_model_cpu_offload:
        problems.append("--enable_model_cpu_offload and DeepSpeed both decide where the weights live; drop "
                        "--enable_model_cpu_offload (ZeRO-3's offload_param keeps the weights in CPU memory), or "
                        "launch without the DeepSpeed accelerate config")
    if placement.blocks_to_swap:
        problems.append(f"--blocks_to_swap {placement.blocks_to_swap} and DeepSpeed both decide where the weights "
                        "live; drop --blocks_to_swap (ZeRO-3's offload_param keeps the weights in CPU memory)")
    if placement.planned:
        problems.append("--vram_budget / --ram_budget choose where the weights live, and so does DeepSpeed; drop "
                        "them (ZeRO-3 partitions and offloads by its config)")
    quantized = packed_weights_flag(model.model_id_with_origin_paths, model.model_paths, model.quant_options)
    if quantized:
        problems.append(f"{quantized} and DeepSpeed cannot be combined: ZeRO partitions plain weights, not 4-bit "
                        "packed ones; drop the quantization (load a bf16 release), or launch without the DeepSpeed "
                        "accelerate config")
    if validation.validation_prompts:
        problems.append(f"--validation_prompts {validation.validation_prompts}: ZeRO-3 partitions the weights "
                        "over the processes, so one process cannot render with them; drop it (render from the LoRA "
                        "files with the validate_lora scripts), or launch without the DeepSpeed accelerate config")
    if training.fused_optimizer_step:
        problems.append("--fused_optimizer_step cannot run under DeepSpeed, which applies the update itself inside "
                        "backward; drop --fused_optimizer_step or launch without the DeepSpeed config")
    if training.ema_decay is not None:
        problems.append(f"--ema_decay {training.ema_decay:g} cannot run under DeepSpeed, whose weights are "
                        "partitioned and whose runs write no training-state checkpoint; drop --ema_decay or launch "
                        "without the DeepSpeed config")
    if training.resume_checkpoint:
        problems.append(f"--resume_from_checkpoint {training.resume_checkpoint}: training-state checkpoints "
                        "are not written under DeepSpeed (ZeRO partitions the optimizer state); continue from a LoRA "
                        "file with --lora_checkpoint instead")
    return problems
