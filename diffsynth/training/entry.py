"""The generic trainer entry: flags -> dataset -> pipeline -> training module -> task stage.

Each model's ``examples/<model>/model_training/train.py`` calls ``cli`` with its pipeline class; ``cli`` runs ``main``
and exits with the code of its outcome (``exit_codes``). Everything that can be checked cheaply (flags, dataset
files, cache presence, the flags that name models, on weightless builds) is checked before any weight is loaded.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shlex
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from ..core.data import DEFAULT_NUM_FRAMES, CacheDataset, UnifiedDataset
from ..core.data.bad_samples import STARTUP_DECODE_PIXELS, bad_samples_error
from ..core.loader import ModelConfig, parse_model_configs, parse_model_id_with_origin_paths, resolve_files
from ..core.shared_weights import LocalGroup
from ..diffusion.base_pipeline import BasePipeline
from .config.parsers import parse_args
from .errors import FlagError, split_csv, task_stage
from .exit_codes import debug_requested, run_with_exit_code
from .loop.runner import launch_data_process_task, launch_training_task
from .objective.batches import bucketed
from .objective.timestep_sampling import TimestepSampling
from .objective.training_module import DiffusionTrainingModule
from .outputs.checkpoint import load_training_state
from .outputs.initial_weights import load_initial_weights
from .outputs.logger import ModelLogger
from .outputs.output_folder import OutputClaim, claim_output_folder
from .placement.config import PlacementConfig
from .placement.deepspeed import deepspeed_config, without_zero3_init
from .placement.quant_options import quant_package_problems, quantized_models
from .placement.shared_host_weights import shared_loads
from .startup.input_checks import check_inputs_used, warn_about_unread_columns
from .startup.model_checks import check_model_flags

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
    if args.quant_options:
        problems.append("--quant_options and DeepSpeed cannot be combined: ZeRO partitions plain weights, not 4-bit "
                        "packed ones; drop --quant_options, or launch without the DeepSpeed accelerate config")
    if args.validation_prompts:
        problems.append(f"--validation_prompts {args.validation_prompts}: ZeRO-3 partitions the weights over the "
                        "processes, so one process cannot render with them; drop it (render from the LoRA files with "
                        "the validate_lora scripts), or launch without the DeepSpeed accelerate config")
    if args.resume_from_checkpoint:
        problems.append(f"--resume_from_checkpoint {args.resume_from_checkpoint}: training-state checkpoints are not "
                        "written under DeepSpeed (ZeRO partitions the optimizer state); continue from a LoRA file "
                        "with --lora_checkpoint instead")
    if problems:
        raise FlagError(problems)


def build_raw_dataset(args: argparse.Namespace, pipeline_class: type[BasePipeline]) -> UnifiedDataset:
    """The metadata dataset, with every referenced file checked (headers only) before any model loads.

    Stage 1 caches each row once: repeats would only write identical files, and stage 2 applies its own
    ``--dataset_repeat``. Its samples keep their row numbers, which name the cache files.

    Raises:
        FlagError: An extra input the pipeline reads as images (``edit_image``) is missing from ``--data_file_keys``.
    """
    extra_inputs = split_csv(args.extra_inputs)
    unloaded = [name for name in extra_inputs
                if name in pipeline_class.image_inputs and name not in split_csv(args.data_file_keys)]
    if unloaded:
        raise FlagError([f"--extra_inputs {name} takes images, but --data_file_keys {args.data_file_keys!r} leaves "
                         f"the {name} column as paths; add it, e.g. --data_file_keys image,{name}"
                         for name in unloaded])
    repeat = args.dataset_repeat
    caching = task_stage(args.task)[1] == "data_process"
    if caching and repeat > 1:
        logger.warning("--dataset_repeat %d is ignored by --task %s: each sample is cached once; pass the repeat "
                       "to the training stage", repeat, args.task)
        repeat = 1
    dataset = UnifiedDataset(
        args.dataset_base_path, args.dataset_metadata_path, repeat=repeat,
        data_file_keys=split_csv(args.data_file_keys), height=args.height, width=args.width,
        max_pixels=args.max_pixels, required_columns=pipeline_class.required_columns(extra_inputs),
        num_frames=getattr(args, "num_frames", DEFAULT_NUM_FRAMES),
        allow_shorter_videos=getattr(args, "allow_shorter_videos", False), on_bad_sample=args.on_bad_sample,
        keep_row_indices=caching, buckets=bucketed(args),
        column_types={name: pipeline_class.input_types[name] for name in extra_inputs
                      if name in pipeline_class.input_types},
    )  # fmt: skip
    warn_about_unread_columns(args, pipeline_class, {column for row in dataset.rows for column in row})
    return dataset


def decode_at_startup(accelerator: Any, dataset: UnifiedDataset, on_bad_sample: str) -> None:
    """Decodes every data file once before the models load, when the dataset is small enough (see ``bad_samples``).

    Each process decodes every ``num_processes``-th row and all share what they found, so every process leaves out
    the same rows under ``--on_bad_sample skip``.

    Raises:
        DatasetError: Some files fail to decode and ``on_bad_sample`` is ``stop``; the message names rows and files.
    """
    from accelerate.utils import gather_object

    if dataset.decode_pixels > STARTUP_DECODE_PIXELS:
        logger.info("the dataset decodes to %.1f gigapixels, more than the %.1f checked at start-up: each file is "
                    "decoded (and checked) when first read", dataset.decode_pixels / 1e9, STARTUP_DECODE_PIXELS / 1e9)
        return
    rows = range(accelerator.process_index, len(dataset.rows), accelerator.num_processes)
    bad = sorted(gather_object(dataset.find_bad_rows(rows)), key=lambda sample: sample.index)
    if not bad:
        return
    if on_bad_sample == "stop":
        raise bad_samples_error(bad, str(dataset.metadata_path))
    for sample in bad:
        logger.warning("skipping sample %s (--on_bad_sample skip)", sample.describe())
    logger.warning("%d of %d samples skipped at start-up: their files fail to decode", len(bad), len(dataset.rows))
    dataset.exclude(bad)


def rerun_command(argv: Sequence[str] | None) -> str:
    """The command line of this run, quoted for a shell, as ``accelerate launch <script> <flags>``."""
    flags = list(sys.argv[1:] if argv is None else argv)
    return shlex.join(["accelerate", "launch", sys.argv[0], *flags])


# Flags that only some pipelines take, by the ``from_pretrained`` option (``BasePipeline.load_options``) they fill.
PIPELINE_OPTION_FLAGS = {"processor_config": "--processor_path", "zero_cond_t": "--zero_cond_t"}


def pipeline_load_options(args: argparse.Namespace, pipeline_class: type[BasePipeline]) -> dict[str, Any]:
    """The ``from_pretrained`` options the pipeline-specific flags ask for.

    Raises:
        FlagError: A flag the pipeline does not take (it would do nothing), or a ``--processor_path`` that is not a
            folder.
    """
    options: dict[str, Any] = {}
    problems = []
    if args.processor_path:
        if not os.path.isdir(args.processor_path):
            problems.append(f"--processor_path {args.processor_path!r} is not a folder; pass the processor/ folder of "
                            "a Qwen-Image-Edit repository, or drop the flag to take the transformer repository's")
        options["processor_config"] = ModelConfig(path=args.processor_path)
    if args.zero_cond_t:
        options["zero_cond_t"] = True
    problems += [f"{PIPELINE_OPTION_FLAGS[name]} does not apply to {pipeline_class.__name__}; drop it"
                 for name in options if name not in pipeline_class.load_options]
    if problems:
        raise FlagError(problems)
    return options


def load_pipeline(args: argparse.Namespace, pipeline_class: type[BasePipeline], accelerator: Any,
                  placement: PlacementConfig | None = None) -> BasePipeline:
    """Loads the models the flags name; ``--offload_models`` entries are built without weights.

    Models whose weights ``placement`` (by default the flags') streams from host memory are loaded there, with
    several processes once per machine into memory they share (``shared_host_weights``). Missing files, the
    pipeline's companion folders (tokenizer, image processor, the edit processor when the run feeds edit images)
    included, are downloaded once per machine: the local main process fetches them while the others wait at a
    barrier, then every process loads from disk.
    """
    options = pipeline_load_options(args, pipeline_class)
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
        # Stage 2 starts from cached states, so inputs such as edit images need no companion folder there.
        inputs = [] if task_stage(args.task)[1] == "train" else split_csv(args.extra_inputs)
        for config in pipeline_class.companion_configs(configs, tokenizer, inputs=inputs, **options):
            resolve_files(config)
    device = accelerator.device
    placement = placement if placement is not None else PlacementConfig.from_args(args)
    load_device = "cpu" if args.initialize_model_on_cpu or placement.weights_on_host else device
    with without_zero3_init(accelerator):
        check_model_flags(args, pipeline_class, configs)
        shared = shared_loads(args, pipeline_class, [c for c in configs if c not in skeletons], placement,
                              accelerator.num_processes)
        return pipeline_class.from_pretrained(torch_dtype=args.torch_dtype, device=device, model_configs=configs,
                                              tokenizer_config=tokenizer, offload_device=load_device,
                                              skeleton_configs=skeletons, shared_weights=shared, **options)


def fp8_model_names(args: argparse.Namespace, pipe: BasePipeline) -> list[str]:
    """The pipeline slots of the ``--fp8_models`` entries (checked to be loaded models by ``check_model_flags``)."""
    if not args.fp8_models:
        return []
    wanted = parse_model_id_with_origin_paths(args.fp8_models)
    return [name for name, config in pipe.model_configs.items() if config in wanted]


def main(pipeline_class: type[BasePipeline], argv: Sequence[str] | None = None, video: bool = False) -> dict:
    """Runs the task the flags describe with ``pipeline_class``, holding ``--output_path`` for the whole run.

    Returns:
        For training: ``{"global_step", "losses", "skipped_samples", "module"}`` (the trained
        ``DiffusionTrainingModule``); for stage 1: ``{"cached": samples computed here}``.
    """
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # Flags and environment: everything cheap is checked before the models load.
    args = parse_args(argv, video=video)
    check_inputs_used(args, pipeline_class)
    missing = quant_package_problems(args)
    if missing:
        raise FlagError(missing)
    placement = PlacementConfig.from_args(args)
    accelerator = make_accelerator(args)
    if deepspeed_config(accelerator) is not None:
        refuse_with_deepspeed(args)
    claim = claim_output_folder(args, accelerator, pipeline_class.lora_target_aliases)
    try:
        return run_task(pipeline_class, args, accelerator, claim, placement, rerun_command(argv))
    finally:
        claim.release()


def run_task(pipeline_class: type[BasePipeline], args: argparse.Namespace, accelerator: Any,
             claim: OutputClaim, placement: PlacementConfig, command: str) -> dict:
    """The body of :func:`main` once the output folder is this run's: the plan, data, models, then the task stage.

    ``placement`` is the flags' placement, replaced by the planner's choice under ``--vram_budget``/``--ram_budget``;
    ``command`` is the command line that reruns this stage, recorded in a stage-1 cache for its completion message.
    """
    _, stage = task_stage(args.task)
    if placement.planned and stage != "data_process" and deepspeed_config(accelerator) is None:
        from .placement.planner import plan_placement  # imports the planning dry run only when asked for

        placement = plan_placement(args, pipeline_class, placement, accelerator.device,
                                   LocalGroup.of_this_process().size)
    args.run_id = claim.run_id  # recorded in training_args.json and in every checkpoint
    checkpoint = claim.checkpoint
    if checkpoint is not None and args.seed is None:
        args.seed = claim.progress["seed"]  # an unseeded run resumes with the seed it drew
    args.seed = agree_on_seed(accelerator, args.seed)
    from accelerate.utils import set_seed

    set_seed(args.seed)
    if stage == "train":
        dataset = CacheDataset(args.dataset_base_path, repeat=args.dataset_repeat,
                               allow_partial=args.allow_partial_cache)
    else:
        dataset = build_raw_dataset(args, pipeline_class)
        decode_at_startup(accelerator, dataset, args.on_bad_sample)
    # Models and the training module.
    # Under DeepSpeed the models load whole; ZeRO partitions them at prepare.
    pipe = load_pipeline(args, pipeline_class, accelerator, placement)
    if args.initial_weights:
        loaded = load_initial_weights(pipe, args.initial_weights, args.remove_prefix_in_ckpt or "")
        logger.info("--resume_from_checkpoint %s: started from its %d weights", args.initial_weights, loaded)
    if isinstance(dataset, UnifiedDataset):
        dataset.use_size_multiple(pipe.size_multiple())  # the loaded VAE's: 32 for the Wan2.2 VAE
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
        fp8_models=fp8_model_names(args, pipe), timestep_sampling=TimestepSampling.from_args(args),
        preset_lora=(args.preset_lora_model, args.preset_lora_path) if args.preset_lora_path else None,
        quant_models=quantized_models(args, pipe.model_configs),
    )  # fmt: skip
    if module.family == "sft" and stage != "data_process" and not module.loss.sampling.is_reference:
        logger.info("timesteps: %s", module.loss.sampling.describe())
    if stage == "data_process":
        return {"cached": launch_data_process_task(accelerator, dataset, module, args, placement, command=command)}
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
        try:
            module.load_trainable_state_dict(trainable)
        except ValueError as error:
            raise ValueError(f"--resume_from_checkpoint {checkpoint}: {error}") from error
        resume = (optimizer_state, scheduler_state, progress)
        logger.info("resuming from %s (optimizer step %d)", checkpoint, progress["global_step"])
    model_logger = ModelLogger.from_args(args, is_main_process=accelerator.is_main_process,
                                         lora_metadata=module.lora_config or None,
                                         resume_step=resume[2]["global_step"] if resume else None)
    model_logger.save_training_args(args)
    try:
        result = launch_training_task(accelerator, dataset, module, model_logger, args, placement, resume)
    finally:
        model_logger.close()
    if accelerator.is_main_process:
        print(f"LoRA / weights written to {args.output_path}")
    if isinstance(dataset, UnifiedDataset):
        result["skipped_samples"] += len(dataset.excluded)  # those left out at start-up
    return {**result, "module": module}


def cli(pipeline_class: type[BasePipeline], argv: Sequence[str] | None = None, video: bool = False) -> NoReturn:
    """The command-line entry of every ``train.py``: runs :func:`main` and exits with the code of how it ended.

    See :mod:`diffsynth.training.exit_codes`: 0 done, 1 error, 2 bad flags or input, 3 non-finite values (diverged),
    75 preempted (resumable), 130 aborted by a second Ctrl-C. Errors of codes 2 and 3 print their message without a
    traceback unless ``--debug`` or ``DIFFSYNTH_DEBUG=1`` asks for it.
    """
    sys.exit(run_with_exit_code(main, pipeline_class, argv, video=video, debug=debug_requested(argv)))
