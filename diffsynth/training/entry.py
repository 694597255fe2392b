"""The generic trainer entry: flags -> dataset -> pipeline -> training module -> task stage.

Each model's ``examples/<model>/model_training/train.py`` calls ``command_line.cli`` with its pipeline, which runs
``main`` and exits with the code of its outcome (``exit_codes``). Everything that can be checked cheaply (flags, dataset
files, cache presence, the flags that name models, on weightless builds) is checked before any weight is loaded.
"""

from __future__ import annotations

import logging
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from ..core.data import UnifiedDataset
from ..core.data.mix import datasets_of
from ..core.library_notices import quiet_library_notices
from ..core.shared_weights import LocalGroup
from ..diffusion.base_pipeline import BasePipeline
from .config import RunConfig
from .config.errors import FlagError
from .config.files import save_run_config
from .config.parsers import ParsedFlags, read_flags
from .config.training import optimizer_placement_problems
from .exit_codes import debug_requested
from .loop import launch_data_process_task, launch_training_task
from .machines import ProcessWatch, agreement_problems, gather_identities
from .objective.training_module import DiffusionTrainingModule
from .outputs import ModelLogger, OutputClaim, claim_output_folder
from .outputs.initial_weights import load_initial_weights
from .outputs.separate_disks import training_state_for_every_process
from .placement.deepspeed import deepspeed_config, match_gradient_clipping
from .placement.quant_options import quant_package_problems
from .startup import build_dataset, build_training_module, build_validation_dataset, check_inputs_used, load_pipeline
from .startup.accelerator import agree_on_seed, make_accelerator
from .startup.launch_checks import launch_problems

logger = logging.getLogger(__name__)


def rerun_command(argv: Sequence[str] | None) -> str:
    """The command line of this run, quoted for a shell, as ``accelerate launch <script> <flags>``."""
    flags = list(sys.argv[1:] if argv is None else argv)
    return shlex.join(["accelerate", "launch", sys.argv[0], *flags])


def main(pipeline_class: type[BasePipeline], argv: Sequence[str] | None = None, video: bool = False,
         flags: ParsedFlags | None = None) -> dict:
    """Runs the task the flags describe with ``pipeline_class``, holding ``--output_path`` for the whole run.

    ``flags`` are ``argv`` already parsed (by the command line, before torch was imported); without them ``argv`` is
    parsed here. ``argv`` is otherwise read only for the rerun command and ``--debug``.

    Returns:
        For training: ``{"global_step", "losses", "skipped_samples", "module"}`` (the trained
        ``DiffusionTrainingModule``); for stage 1: ``{"cached": samples computed here}``.
    """
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    quiet_library_notices(debug_requested(argv))  # before the libraries load, which is when most of them log
    # Flags and environment: everything cheap is checked before the models load.
    flags = flags or read_flags(argv, video=video)
    config = flags.run_config().with_pipeline_defaults(pipeline_class)
    check_inputs_used(config, pipeline_class)
    missing = quant_package_problems(config.model.quant_options, config.model.model_id_with_origin_paths,
                                     config.model.model_paths)
    if missing:
        raise FlagError(missing)
    accelerator = make_accelerator(config.training)
    identities = gather_identities(config, accelerator)  # every machine runs this code with these flags, or none
    if problems := [*agreement_problems(identities), *launch_problems(config, accelerator)]:
        raise FlagError(problems)
    ProcessWatch.start(identities, accelerator.process_index)
    if (zero_config := deepspeed_config(accelerator)) is not None:
        match_gradient_clipping(zero_config, config.training.max_grad_norm)  # an auto norm becomes the flag's
    claim = claim_output_folder(config, accelerator, pipeline_class.lora_target_aliases)
    try:
        return run_task(pipeline_class, config, accelerator, claim, rerun_command(argv))
    finally:
        claim.release()


def run_task(pipeline_class: type[BasePipeline], config: RunConfig, accelerator: Any, claim: OutputClaim,
             command: str) -> dict:
    """The body of :func:`main` once the output folder is this run's: the plan, data, models, then the task stage.

    ``command`` is the command line that reruns this stage, recorded in a stage-1 cache for its completion message.
    """
    from accelerate.utils import set_seed

    stage = config.training.stage
    # The plan: under --vram_budget / --ram_budget the planner's placement replaces the flags'.
    if config.placement.planned and stage != "data_process" and deepspeed_config(accelerator) is None:
        from .placement.planner import plan_placement  # imports the planning dry run only when asked for

        config = config.with_placement(plan_placement(config, pipeline_class, accelerator.device,
                                                      LocalGroup.of_this_process().size))
        if problems := optimizer_placement_problems(config.training, config.placement):
            raise FlagError(problems)
    # The seed: the flag's, the resumed run's (an unseeded run resumes with the seed it drew), or one drawn here.
    seed = config.training.seed
    if claim.checkpoint is not None and seed is None:
        seed = claim.progress["seed"]
    config = config.with_seed(agree_on_seed(accelerator, seed))
    set_seed(config.training.seed)
    # Data, then the models (under DeepSpeed they load whole; ZeRO partitions them at prepare).
    dataset = build_dataset(config, pipeline_class, accelerator)
    validation_set = build_validation_dataset(config, pipeline_class, accelerator)
    pipe = load_pipeline(config, pipeline_class, accelerator)
    initial_weights = config.training.initial_weights
    if initial_weights:
        loaded = load_initial_weights(pipe, initial_weights, config.output.remove_prefix_in_ckpt or "")
        logger.info("--resume_from_checkpoint %s: started from its %d weights", initial_weights, loaded)
    for one in (*datasets_of(dataset), validation_set):
        if isinstance(one, UnifiedDataset):
            one.use_size_multiple(pipe.size_multiple())  # the loaded VAE's: 32 for the Wan2.2 VAE
    # The training module; the LoRA's initial weights come from the seed alone, whatever loading drew before.
    set_seed(config.training.seed)
    module = build_training_module(config, pipe)
    if module.family == "sft" and stage != "data_process" and not module.loss.sampling.is_reference:
        logger.info("timesteps: %s", module.loss.sampling.describe())
    # The task stage: stage 1 caches; training checks a cache against the models, then trains.
    if stage == "data_process":
        return {"cached": launch_data_process_task(accelerator, dataset, module, config, command=command,
                                                   validation_set=validation_set)}
    if stage == "train":
        for one in datasets_of(dataset):
            check_cache_matches(one, module)
        if validation_set is not None:
            check_cache_matches(validation_set, module)
    return train(accelerator, dataset, module, config, claim, validation_set)


def check_cache_matches(dataset: Any, module: DiffusionTrainingModule) -> None:
    """A stage-1 cache must have been made by these models and flags (``CacheDataset.check_info``)."""
    expected = module.cache_info()
    # Stage 1 may have left the trained model out entirely (it never runs it); then there is no config to match.
    stored = dataset.info.get("model_configs", {})
    expected["model_configs"] = {name: entry for name, entry in expected["model_configs"].items() if name in stored}
    dataset.check_info(expected)


def train(accelerator: Any, dataset: Any, module: DiffusionTrainingModule, config: RunConfig,
          claim: OutputClaim, validation_set: Any = None) -> dict:
    """Restores the checkpoint a resume continues, opens the logger and runs the training loop (measuring the loss
    of ``validation_set``, when given)."""
    resume = None
    if claim.checkpoint is not None:
        trainable, optimizer_state, scheduler_state, progress = training_state_for_every_process(
            claim.checkpoint, accelerator, claim.shared)
        try:
            module.load_trainable_state_dict(trainable)
        except ValueError as error:
            raise ValueError(f"--resume_from_checkpoint {claim.checkpoint}: {error}") from error
        resume = (optimizer_state, scheduler_state, progress)
        logger.info("resuming from %s (optimizer step %d)", claim.checkpoint, progress["global_step"])
    model_logger = ModelLogger.from_config(config, is_main_process=accelerator.is_main_process,
                                           lora_metadata=module.lora_config or None,
                                           resume_step=resume[2]["global_step"] if resume else None,
                                           aligned_lora_layout=type(module.pipe).aligned_lora_layout)

    def record_run() -> None:
        model_logger.save_training_args({**config.to_flags(), "run_id": claim.run_id})
        if accelerator.is_main_process:
            save_run_config(config, claim.run_id)

    try:
        result = launch_training_task(accelerator, dataset, module, model_logger, config, claim.run_id, resume,
                                      on_start=record_run, validation_set=validation_set)
    finally:
        model_logger.close()
    if accelerator.is_main_process:
        print(f"LoRA / weights written to {config.output.output_path}")
    for one in datasets_of(dataset):
        if isinstance(one, UnifiedDataset):
            result["skipped_samples"] += len(one.excluded)  # those left out at start-up
    return {**result, "module": module}

