"""The run's pipeline and training module: the models the flags name, loaded where the placement wants them."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ...core.loader import ModelConfig, parse_model_configs, parse_model_id_with_origin_paths, resolve_files
from ...core.loader.resolve import REPOSITORY_ROOT
from ...diffusion.base_pipeline import BasePipeline
from ..config.errors import FlagError
from ..objective.adapter import AdapterSettings
from ..objective.loss_mask import LossMask
from ..objective.training_module import DiffusionTrainingModule
from ..placement.deepspeed import without_zero3_init
from ..placement.quant_options import quantized_models
from ..placement.shared_host_weights import shared_loads
from .model_checks import check_model_flags

if TYPE_CHECKING:
    from ..config import RunConfig
    from ..config.model import ModelSection

# Flags that only some pipelines take, by the ``from_pretrained`` option (``BasePipeline.load_options``) they fill.
PIPELINE_OPTION_FLAGS = {"processor_config": "--processor_path", "zero_cond_t": "--zero_cond_t",
                         "tokenizer_2_config": "--tokenizer_2_path"}


def tokenizer_config(value: str) -> ModelConfig:
    """``--tokenizer_path``: a local folder, or a ``model_id:pattern`` entry resolved (and downloaded when missing) as
    ``--model_id_with_origin_paths`` entries are, the way the reference's FLUX.2 scripts give it
    (``black-forest-labs/FLUX.2-klein-4B:tokenizer/``)."""
    if os.path.exists(value) or ":" not in value:
        return ModelConfig(path=value)
    if value.endswith(":"):  # the repository's root, as the reference's Krea 2 scripts give it
        return ModelConfig(model_id=value[:-1], origin_file_pattern=REPOSITORY_ROOT)
    return parse_model_id_with_origin_paths(value)[0]


def pipeline_load_options(model: ModelSection, pipeline_class: type[BasePipeline]) -> dict[str, Any]:
    """The ``from_pretrained`` options the pipeline-specific flags ask for.

    Raises:
        FlagError: A flag the pipeline does not take (it would do nothing), or a ``--processor_path`` that is not a
            folder.
    """
    options: dict[str, Any] = {}
    problems = []
    if model.processor_path:
        if not os.path.isdir(model.processor_path):
            problems.append(f"--processor_path {model.processor_path!r} is not a folder; pass the processor/ folder "
                            "of a Qwen-Image-Edit repository, or drop the flag to take the transformer repository's")
        options["processor_config"] = ModelConfig(path=model.processor_path)
    if model.zero_cond_t:
        options["zero_cond_t"] = True
    if model.tokenizer_2_path:
        options["tokenizer_2_config"] = tokenizer_config(model.tokenizer_2_path)
    if model.tokenizer_path and model.tokenizer_1_path:
        problems.append("--tokenizer_path and --tokenizer_1_path both name the (first) tokenizer; give one")
    problems += [f"{PIPELINE_OPTION_FLAGS[name]} does not apply to {pipeline_class.__name__}; drop it"
                 for name in options if name not in pipeline_class.load_options]
    if problems:
        raise FlagError(problems)
    return options


def load_pipeline(config: RunConfig, pipeline_class: type[BasePipeline], accelerator: Any) -> BasePipeline:
    """Loads the models the flags name; ``--offload_models`` entries are built without weights.

    Models whose weights ``config.placement`` streams from host memory are loaded there, with several processes
    once per machine into memory they share (``shared_host_weights``). Missing files, the pipeline's companion
    folders (tokenizer, image processor, the edit processor when the run feeds edit images) included, are
    downloaded once per machine: the local main process fetches them while the others wait at a barrier, then every
    process loads from disk.
    """
    model, placement = config.model, config.placement
    options = pipeline_load_options(model, pipeline_class)
    configs = parse_model_configs(model.model_paths, model.model_id_with_origin_paths)
    skeletons = parse_model_id_with_origin_paths(model.offload_models) if model.offload_models else []
    unmatched = [entry.describe() for entry in skeletons if entry not in configs]
    if unmatched:
        raise FlagError([f"--offload_models entries {unmatched} are not among the models loaded; copy them exactly "
                         "from --model_id_with_origin_paths"])
    first_tokenizer = model.tokenizer_path or model.tokenizer_1_path
    tokenizer = tokenizer_config(first_tokenizer) if first_tokenizer else None
    with accelerator.local_main_process_first():
        for entry in [*configs, *([tokenizer] if tokenizer else [])]:
            resolve_files(entry)
        # Stage 2 starts from cached states, so inputs such as edit images need no companion folder there.
        inputs = [] if config.training.stage == "train" else model.extra_input_names
        for entry in pipeline_class.companion_configs(configs, tokenizer, inputs=inputs, **options):
            resolve_files(entry)
    device = accelerator.device
    load_device = "cpu" if model.initialize_model_on_cpu or placement.weights_on_host else device
    with without_zero3_init(accelerator):
        check_model_flags(config, pipeline_class, configs)
        shared = shared_loads(placement, model, config.training, pipeline_class,
                              [entry for entry in configs if entry not in skeletons], accelerator.num_processes)
        return pipeline_class.from_pretrained(torch_dtype=model.torch_dtype, device=device, model_configs=configs,
                                              tokenizer_config=tokenizer, offload_device=load_device,
                                              skeleton_configs=skeletons, shared_weights=shared, **options)


def fp8_model_names(model: ModelSection, pipe: BasePipeline) -> list[str]:
    """The pipeline slots of the ``--fp8_models`` entries (checked to be loaded models by ``check_model_flags``)."""
    if not model.fp8_models:
        return []
    wanted = parse_model_id_with_origin_paths(model.fp8_models)
    return [name for name, entry in pipe.model_configs.items() if entry in wanted]


def build_training_module(config: RunConfig, pipe: BasePipeline) -> DiffusionTrainingModule:
    """The training module of the run's task: frozen models, the LoRA or the fully trained models, the stage's
    units, the loss with its timestep sampling."""
    training, lora, placement = config.training, config.lora, config.placement
    return DiffusionTrainingModule(
        pipe, task=training.task, trainable_models=training.trainable, lora_base_model=lora.lora_base_model,
        lora_target_modules=lora.targets, lora_rank=lora.lora_rank, lora_alpha=lora.lora_alpha,
        lora_checkpoint=lora.lora_checkpoint, use_gradient_checkpointing=placement.gradient_checkpointing,
        use_gradient_checkpointing_offload=placement.use_gradient_checkpointing_offload,
        extra_inputs=config.model.extra_input_names,
        timestep_boundaries=(training.min_timestep_boundary, training.max_timestep_boundary),
        fp8_models=fp8_model_names(config.model, pipe), timestep_sampling=config.timesteps, preset_lora=lora.preset,
        quant_models=quantized_models(config.model.quant_options, pipe.model_configs),
        adapter=AdapterSettings(lora.lora_type, use_dora=lora.use_dora, lokr_factor=lora.lokr_factor),
        loss_mask=LossMask(config.masked_loss.weight) if config.masked_loss.masked_loss else None,
        column_defaults=config.dataset.column_defaults,
    )  # fmt: skip
