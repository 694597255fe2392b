"""The generic trainer entry: flags -> dataset -> pipeline -> training module -> task stage.

Each model's ``examples/<model>/model_training/train.py`` calls ``main`` with its pipeline class. Everything that
can be checked cheaply (flags, dataset files, cache presence) is checked before any model is loaded.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
from collections.abc import Sequence
from typing import Any

from ..core.data import DEFAULT_NUM_FRAMES, CacheDataset, UnifiedDataset
from ..core.loader import (ModelConfig, ModelLoadError, load_skeleton, parse_model_configs,
                           parse_model_id_with_origin_paths, resolve_files)
from .base_pipeline import BasePipeline
from .checkpoint import load_training_state, read_progress, resolve_checkpoint
from .deepspeed_support import deepspeed_config, without_zero3_init
from .logger import ModelLogger
from .parsers import FlagError, parse_args, split_csv, task_stage
from .placement_config import PlacementConfig
from .runner import launch_data_process_task, launch_training_task
from .training_module import DiffusionTrainingModule, resolve_lora_targets

logger = logging.getLogger(__name__)


def make_accelerator(args: argparse.Namespace) -> Any:
    """The run's ``Accelerator``: accumulation, mixed precision, DDP's unused-parameter search, CPU fallback."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    # Without CUDA, ask for the CPU explicitly: a multi-process launch would otherwise look for GPUs. Under a
    # DeepSpeed launch the flag would switch DeepSpeed off, so DeepSpeed picks its (CPU) accelerator itself.
    deepspeed_launch = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    return Accelerator(
        cpu=not torch.cuda.is_available() and not deepspeed_launch,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        mixed_precision=args.mixed_precision,
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=args.find_unused_parameters)],
    )


def agree_on_seed(accelerator: Any, seed: int | None) -> int:
    """``seed``, or one drawn on the main process and shared, so every process shuffles the data alike."""
    from accelerate.utils import broadcast_object_list

    if seed is not None:
        return seed
    drawn = [random.SystemRandom().randrange(2**31)]
    if accelerator.num_processes > 1:
        broadcast_object_list(drawn)
    return drawn[0]


def refuse_with_deepspeed(args: argparse.Namespace) -> None:
    """Flags that cannot work when accelerate runs DeepSpeed, each with its fix."""
    problems = []
    if args.enable_model_cpu_offload:
        problems.append("--enable_model_cpu_offload and DeepSpeed both decide where the weights live; drop "
                        "--enable_model_cpu_offload (ZeRO-3's offload_param keeps the weights in CPU memory), or "
                        "launch without the DeepSpeed accelerate config")
    if args.blocks_to_swap:
        problems.append(f"--blocks_to_swap {args.blocks_to_swap} and DeepSpeed both decide where the weights live; "
                        "drop --blocks_to_swap (ZeRO-3's offload_param keeps the weights in CPU memory)")
    if args.vram_budget is not None or args.ram_budget is not None:
        problems.append("--vram_budget / --ram_budget choose where the weights live, and so does DeepSpeed; drop "
                        "them (ZeRO-3 partitions and offloads by its config)")
    if args.resume_from_checkpoint:
        problems.append(f"--resume_from_checkpoint {args.resume_from_checkpoint}: training-state checkpoints are not "
                        "written under DeepSpeed (ZeRO partitions the optimizer state); continue from a LoRA file "
                        "with --lora_checkpoint instead")
    if problems:
        raise FlagError(problems)


def build_raw_dataset(args: argparse.Namespace, pipeline_class: type[BasePipeline]) -> UnifiedDataset:
    """The metadata dataset, with every referenced file checked (headers only) before any model loads.

    Stage 1 caches each row once: repeats would only write identical files, and stage 2 applies its own
    ``--dataset_repeat``.
    """
    extra_inputs = split_csv(args.extra_inputs)
    repeat = args.dataset_repeat
    if task_stage(args.task)[1] == "data_process" and repeat > 1:
        logger.warning("--dataset_repeat %d is ignored by --task %s: each sample is cached once; pass the repeat "
                       "to the training stage", repeat, args.task)
        repeat = 1
    return UnifiedDataset(
        args.dataset_base_path, args.dataset_metadata_path, repeat=repeat,
        data_file_keys=split_csv(args.data_file_keys), height=args.height, width=args.width,
        max_pixels=args.max_pixels, required_columns=[*pipeline_class.training_columns, *extra_inputs],
        num_frames=getattr(args, "num_frames", DEFAULT_NUM_FRAMES),
        allow_shorter_videos=getattr(args, "allow_shorter_videos", False),
    )  # fmt: skip


def check_lora_targets(args: argparse.Namespace, pipeline_class: type[BasePipeline],
                       configs: Sequence[ModelConfig]) -> None:
    """Checks ``--lora_target_modules`` on a weightless build of the LoRA's model, before minutes of loading."""
    if not args.lora_base_model or task_stage(args.task)[1] == "data_process":
        return
    for config in configs:
        try:
            skeleton = load_skeleton(config, torch_dtype=args.torch_dtype)
        except ModelLoadError:
            continue  # a tokenizer folder, or a model the real load will report on
        if pipeline_class.model_roles.get(type(skeleton).__name__) == args.lora_base_model:
            resolve_lora_targets(skeleton, split_csv(args.lora_target_modules), pipeline_class.lora_target_aliases,
                                 args.lora_base_model)
            return


def load_pipeline(args: argparse.Namespace, pipeline_class: type[BasePipeline], accelerator: Any,
                  placement: PlacementConfig | None = None) -> BasePipeline:
    """Loads the models the flags name; ``--offload_models`` entries are built without weights.

    Models whose weights ``placement`` (by default the flags') streams from host memory are loaded there. Missing
    files, the pipeline's companion folders (tokenizer, image processor) included, are downloaded once per machine:
    the local main process fetches them while the others wait at a barrier, then every process loads from disk.
    """
    configs = parse_model_configs(args.model_paths, args.model_id_with_origin_paths)
    skeletons = parse_model_id_with_origin_paths(args.offload_models) if args.offload_models else []
    unmatched = [config.describe() for config in skeletons if config not in configs]
    if unmatched:
        raise FlagError([f"--offload_models entries {unmatched} are not among the models loaded; copy them exactly "
                         "from --model_id_with_origin_paths"])
    tokenizer = ModelConfig(path=args.tokenizer_path) if args.tokenizer_path else None
    with accelerator.local_main_process_first():
        for config in [*configs, *([tokenizer] if tokenizer else [])]:
            resolve_files(config)
        for config in pipeline_class.companion_configs(configs, tokenizer):
            resolve_files(config)
    device = accelerator.device
    placement = placement if placement is not None else PlacementConfig.from_args(args)
    load_device = "cpu" if args.initialize_model_on_cpu or placement.weights_on_host else device
    with without_zero3_init(accelerator):
        check_lora_targets(args, pipeline_class, configs)
        return pipeline_class.from_pretrained(torch_dtype=args.torch_dtype, device=device, model_configs=configs,
                                              tokenizer_config=tokenizer, offload_device=load_device,
                                              skeleton_configs=skeletons)


def fp8_model_names(args: argparse.Namespace, pipe: BasePipeline) -> list[str]:
    """The pipeline slots of the ``--fp8_models`` entries."""
    if not args.fp8_models:
        return []
    wanted = parse_model_id_with_origin_paths(args.fp8_models)
    names = [name for name, config in pipe.model_configs.items() if config in wanted]
    unmatched = [config.describe() for config in wanted if config not in pipe.model_configs.values()]
    if unmatched:
        raise FlagError([f"--fp8_models entries {unmatched} are not among the models loaded; copy them exactly from "
                         "--model_id_with_origin_paths"])
    return names


def main(pipeline_class: type[BasePipeline], argv: Sequence[str] | None = None, video: bool = False) -> dict:
    """Runs the task the flags describe with ``pipeline_class``.

    Returns:
        For training: ``{"global_step", "losses", "module"}`` (the trained ``DiffusionTrainingModule``); for stage 1:
        ``{"cached": samples computed here}``.
    """
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # Flags and environment: everything cheap is checked before the models load.
    args = parse_args(argv, video=video)
    placement = PlacementConfig.from_args(args)
    _, stage = task_stage(args.task)
    accelerator = make_accelerator(args)
    if deepspeed_config(accelerator) is not None:
        refuse_with_deepspeed(args)
    elif placement.planned and stage != "data_process":
        from .planner import plan_placement  # imports the planning dry run only when asked for

        placement = plan_placement(args, pipeline_class, placement, accelerator.device)
    checkpoint = resolve_checkpoint(args.resume_from_checkpoint, args.output_path) \
        if args.resume_from_checkpoint else None
    if checkpoint is not None and args.seed is None:
        args.seed = read_progress(checkpoint)["seed"]  # an unseeded run resumes with the seed it drew
    args.seed = agree_on_seed(accelerator, args.seed)
    from accelerate.utils import set_seed

    set_seed(args.seed)
    if stage == "train":
        dataset = CacheDataset(args.dataset_base_path, repeat=args.dataset_repeat)
    else:
        dataset = build_raw_dataset(args, pipeline_class)
    # Models and the training module.
    pipe = load_pipeline(args, pipeline_class, accelerator, placement)  # under DeepSpeed: whole, then ZeRO partitions at prepare
    # The LoRA's initial weights come from the seed alone, whatever loading drew before.
    set_seed(args.seed)
    module = DiffusionTrainingModule(
        pipe, task=args.task, trainable_models=split_csv(args.trainable_models),
        lora_base_model=args.lora_base_model, lora_target_modules=split_csv(args.lora_target_modules),
        lora_rank=args.lora_rank, lora_alpha=args.lora_alpha, lora_checkpoint=args.lora_checkpoint,
        use_gradient_checkpointing=placement.gradient_checkpointing,
        use_gradient_checkpointing_offload=placement.use_gradient_checkpointing_offload,
        extra_inputs=split_csv(args.extra_inputs),
        timestep_boundaries=(args.min_timestep_boundary, args.max_timestep_boundary),
        fp8_models=fp8_model_names(args, pipe),
    )  # fmt: skip
    if stage == "data_process":
        return {"cached": launch_data_process_task(accelerator, dataset, module, args, placement)}
    if stage == "train":
        expected = module.cache_info()
        # Stage 1 may have left the trained model out entirely (it never runs it); then there is no config to match.
        stored = dataset.info.get("model_configs", {})
        expected["model_configs"] = {name: config for name, config in expected["model_configs"].items()
                                     if name in stored}
        dataset.check_info(expected)
    # Resume point, logger, then the loop.
    resume = None
    if checkpoint is not None:
        trainable, optimizer_state, scheduler_state, progress = load_training_state(checkpoint)
        module.load_trainable_state_dict(trainable)
        resume = (optimizer_state, scheduler_state, progress)
        logger.info("resuming from %s (optimizer step %d)", checkpoint, progress["global_step"])
    model_logger = ModelLogger.from_args(args, is_main_process=accelerator.is_main_process,
                                         lora_metadata=module.lora_config or None)
    model_logger.save_training_args(args)
    try:
        result = launch_training_task(accelerator, dataset, module, model_logger, args, placement, resume)
    finally:
        model_logger.close()
    if accelerator.is_main_process:
        print(f"LoRA / weights written to {args.output_path}")
    return {**result, "module": module}
