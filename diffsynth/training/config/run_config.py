"""One run's configuration: a frozen section per concern, built once from the parsed flags and checked together.

Each section checks its own flags when it is built; ``RunConfig`` then checks the sections against each other
(a stage that reads a cache needs no metadata file, 4-bit weights cannot be offloaded, ...). Every problem of every
section is reported at once, in one ``FlagError``; a check across sections runs when the sections it reads are
sound, so a wrong value is named once. After construction nothing changes it: a run that draws its seed or lets the
planner choose its placement makes a new config (:meth:`RunConfig.with_seed`, :meth:`RunConfig.with_placement`), and
so does filling in the defaults that depend on the model (:meth:`RunConfig.with_pipeline_defaults`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .timesteps import TimestepFlags
from .console import ConsoleSection
from .dataset import DatasetSection
from .dataset_entries import regularization_problems
from .errors import FlagError, split_csv
from .lora import LoraSection
from .masked_loss import MaskedLossSection, masked_loss_problems
from .model import ModelSection
from .output import OutputSection
from .placement import PlacementConfig
from .reference_flags import unsupported_feature_problems, unsupported_flag_problems
from .section import Section
from .sections import SECTIONS
from .training import TrainingSection, optimizer_placement_problems
from .validation import ValidationSection
from .validation_loss import ValidationLossSection, validation_loss_problems
from .validation_prompts import ValidationConfig, ValidationError

if TYPE_CHECKING:
    from ...diffusion.base_pipeline import BasePipeline

logger = logging.getLogger(__name__)



def _runnable_problems(training: TrainingSection, lora: LoraSection, dataset: DatasetSection,
                       model: ModelSection) -> list[str]:
    """What a run needs to run at all: a model, something to train, the dataset its stage reads."""
    task, family, stage = training.task, training.family, training.stage
    problems = []
    if not model.model_paths and not model.model_id_with_origin_paths:
        problems.append("no model given: pass --model_id_with_origin_paths (e.g. "
                        "'Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors') or --model_paths")
    if training.trains and not training.trainable_models and not lora.lora_base_model:
        targets = "" if lora.lora_target_modules is None else f" {lora.lora_target_modules!r}"
        problems.append(f"--task {task} has nothing to train: neither --trainable_models nor --lora_base_model is "
                        f"set (--lora_target_modules{targets} picks layers, not a model); add "
                        "--lora_base_model dit for a LoRA, or --trainable_models dit for a full fine-tune")
    if stage == "train" and not dataset.dataset_base_path:
        problems.append(f"--task {task} reads the stage-1 cache, but --dataset_base_path is empty; pass the "
                        f"--output_path of the {family}:data_process run as --dataset_base_path")
    if stage != "train" and not dataset.dataset_metadata_path and not dataset.datasets:
        problems.append(f"--task {task} reads a dataset, but --dataset_metadata_path is unset; pass the "
                        "metadata .csv / .json / .jsonl (columns such as image,prompt)")
    return problems + training.device_problems()


def _task_problems(training: TrainingSection, dataset: DatasetSection) -> list[str]:
    """Dataset flags the task's stage does not read, and batches a task cannot form."""
    task, family, stage = training.task, training.family, training.stage
    problems = []
    if stage == "train":
        if dataset.dataset_metadata_path:
            problems.append(f"--task {task} reads the stage-1 cache in --dataset_base_path, not a metadata file; "
                            f"drop --dataset_metadata_path {dataset.dataset_metadata_path!r} (or use --task {family} "
                            "to train from the raw dataset)")
        if dataset.on_bad_sample != "stop":
            problems.append(f"--on_bad_sample {dataset.on_bad_sample} has no effect on --task {task}, which reads "
                            f"the stage-1 cache; pass it to the {family}:data_process run, or drop it")
    elif dataset.allow_partial_cache:
        problems.append(f"--allow_partial_cache applies to the stage-1 cache that --task {family}:train reads; drop "
                        f"it from --task {task}")
    if dataset.batch_size > 1 and family == "direct_distill":
        problems.append(f"--batch_size {dataset.batch_size} with --task {task}: each sample runs its own sampler (its "
                        "seed, steps and guidance from the metadata), so samples cannot share a batch; pass "
                        f"--batch_size 1 with --gradient_accumulation_steps {dataset.batch_size} instead")
    return problems


def _regularization_problems(training: TrainingSection, dataset: DatasetSection) -> list[str]:
    return regularization_problems(training.stage, training.task, training.family, dataset.datasets,
                                   dataset.dataset_metadata_path, dataset.reg_dataset_metadata_path,
                                   dataset.reg_dataset_base_path, dataset.prior_loss_weight)


def _quant_problems(model: ModelSection, placement: PlacementConfig) -> list[str]:
    """4-bit weights (``--quant_options``, or a release packed so) cannot move, and the planner does not model them."""
    from .quant_flags import packed_weights_flag

    flag = packed_weights_flag(model.model_id_with_origin_paths, model.model_paths, model.quant_options)
    if flag is None:
        return []
    problems = []
    for name, given in (("enable_model_cpu_offload", placement.enable_model_cpu_offload),
                        ("blocks_to_swap", placement.blocks_to_swap)):
        if given:
            problems.append(f"{flag} and --{name} cannot be combined: the offloader and block swap move plain "
                            f"weights, not 4-bit packed ones; drop --{name} (a 4-bit model needs a quarter of the "
                            "memory of bf16), or drop the quantization (load a bf16 release)")
    for name, budget in (("vram_budget", placement.vram_budget), ("ram_budget", placement.ram_budget)):
        if budget is not None:
            problems.append(f"{flag} and --{name} cannot be combined: the memory planner does not model 4-bit "
                            f"weights and may choose offload or block swap, which cannot move them; drop --{name}")
    return problems


def _dora_storage_problems(lora: LoraSection, model: ModelSection, training: TrainingSection) -> list[str]:
    """DoRA on compressed weights where the flags alone tell: a release packed 4-bit, or a training stage whose every
    model is stored in fp8 or 4-bit (a split run's stage 2 that loads the transformer alone). Otherwise which model an entry loads is read from
    its files' config, before any weight loads (``startup.model_checks``)."""
    if not (lora.use_dora and lora.lora_base_model) or training.stage == "data_process" or model.model_paths:
        return []
    from .quant_flags import packed_releases, parse_quant_options

    loaded = split_csv(model.model_id_with_origin_paths)
    packed = packed_releases(model.model_id_with_origin_paths, None)
    if packed:
        return [f"--use_dora with --lora_base_model {lora.lora_base_model} of the 4-bit release {packed[0]}, whose "
                "Linear weights load packed: DoRA reads the base weights as they are every step; drop --use_dora (a "
                "plain LoRA trains on them), or load a bf16 release"]
    compressed = {*split_csv(model.fp8_models), *parse_quant_options(model.quant_options)}
    if not loaded or not set(loaded) <= compressed:
        return []
    return [f"--use_dora with --lora_base_model {lora.lora_base_model}, whose weights --fp8_models / --quant_options "
            "store compressed (they name every model this run loads): DoRA reads the base weights as they are every "
            "step; drop --use_dora (a plain LoRA trains on them), or drop the storage flag"]


def _timestep_problems(training: TrainingSection, timesteps: TimestepFlags) -> list[str]:
    if training.family != "sft" and not timesteps.is_reference:
        return [f"--timestep_sampling {timesteps.timestep_sampling} / --weighting_scheme {timesteps.weighting_scheme} "
                f"shape the sft loss; --task {training.task} runs whole denoising loops and draws no timesteps; drop "
                "them"]
    return []


def _validation_problems(validation: ValidationSection, training: TrainingSection,
                         dataset: DatasetSection) -> list[str]:
    if validation.validation_prompts is None:
        return []
    if not training.trains:
        return [f"--validation_prompts: --task {training.task} trains nothing to render; pass it to the training "
                "stage"]
    try:
        ValidationConfig.from_sections(validation, dataset)
    except ValidationError as error:
        return error.problems
    return []


def _validation_loss_problems(validation_loss: ValidationLossSection, training: TrainingSection) -> list[str]:
    return validation_loss_problems(validation_loss, training.task, training.family, training.stage)


def _overwrite_problems(output: OutputSection, training: TrainingSection) -> list[str]:
    resume = training.resume_checkpoint
    if not (output.overwrite_output and resume):
        return []
    folder = Path(output.output_path).resolve()
    if resume != "latest" and not Path(resume).resolve().is_relative_to(folder):
        return []  # resuming from another folder's checkpoint into a cleaned one is fine
    return [f"--overwrite_output removes the checkpoints in --output_path {output.output_path}, which "
            f"--resume_from_checkpoint {resume} would resume from; drop --overwrite_output to continue that run, or "
            "drop --resume_from_checkpoint to start afresh"]


#: The checks across sections, each with the names of the sections it reads (in its parameters' order).
CROSS_CHECKS: tuple[tuple[Callable[..., list[str]], tuple[str, ...]], ...] = (
    (_task_problems, ("training", "dataset")),
    (_regularization_problems, ("training", "dataset")),
    (_quant_problems, ("model", "placement")),
    (_dora_storage_problems, ("lora", "model", "training")),
    (_timestep_problems, ("training", "timesteps")),
    (_validation_problems, ("validation", "training", "dataset")),
    (_validation_loss_problems, ("validation_loss", "training")),
    (_overwrite_problems, ("output", "training")),
    (optimizer_placement_problems, ("training", "placement")),
    (masked_loss_problems, ("masked_loss", "dataset", "training")),
)


#: What a run needs to run, beyond consistency; the planner (``python -m diffsynth.plan``) plans without it.
RUNNABLE_CHECK = (_runnable_problems, ("training", "lora", "dataset", "model"))


def _cross_problems(sections: Mapping[str, Section], runnable: bool = False) -> list[str]:
    problems = []
    for check, names in CROSS_CHECKS + ((RUNNABLE_CHECK,) if runnable else ()):
        if all(name in sections for name in names):
            problems += check(*(sections[name] for name in names))
    return problems


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Every flag of one run, by section (the fields of each section are named after its flags).

    Raises:
        FlagError: From construction, the problems across sections (what a run needs to run is checked by
            :meth:`from_flags`).
    """

    dataset: DatasetSection
    model: ModelSection
    training: TrainingSection
    timesteps: TimestepFlags
    output: OutputSection
    validation: ValidationSection
    validation_loss: ValidationLossSection
    lora: LoraSection
    placement: PlacementConfig
    console: ConsoleSection
    masked_loss: MaskedLossSection = dataclasses.field(default_factory=MaskedLossSection)

    def __post_init__(self) -> None:
        problems = _cross_problems(self.sections())
        if problems:
            raise FlagError(problems)

    @classmethod
    def from_flags(cls, flags: Mapping[str, Any], runnable: bool = True) -> RunConfig:
        """The config of parsed flag values (flag name -> value, as ``build_parser`` and config files give them).

        ``runnable`` also checks what a run needs to run (a model, something to train, the dataset of its stage);
        without it the config describes a run to plan.

        Raises:
            FlagError: Every problem at once: each section's, an unsupported reference flag, and across sections.
        """
        refused = unsupported_feature_problems(flags)
        if refused:  # no other check of a command for a model or task not supported here would mean anything
            raise FlagError(refused)
        sections, problems = {}, unsupported_flag_problems(flags)
        for name, section_class in SECTIONS.items():
            try:
                sections[name] = section_class.from_flags(flags)
            except FlagError as error:
                problems += error.problems
        problems += _cross_problems(sections, runnable)
        if problems:
            raise FlagError(problems)
        return cls(**sections)

    @classmethod
    def from_namespace(cls, namespace: Any, runnable: bool = True) -> RunConfig:
        """The config of an ``argparse.Namespace`` from ``build_parser`` (other attributes are ignored)."""
        return cls.from_flags(vars(namespace), runnable)

    def sections(self) -> dict[str, Section]:
        """Section name -> section."""
        return {name: getattr(self, name) for name in SECTIONS}

    def to_flags(self) -> dict[str, Any]:
        """Flag name -> value of every flag: what ``config.yaml`` holds and ``from_flags`` reads back."""
        return {name: value for section in self.sections().values() for name, value in section.flags().items()}

    def with_seed(self, seed: int) -> RunConfig:
        """This config with ``--seed`` set, as a run records the seed it drew."""
        return dataclasses.replace(self, training=self.training.with_seed(seed))

    def with_placement(self, placement: PlacementConfig) -> RunConfig:
        """This config with the placement the memory planner chose."""
        return dataclasses.replace(self, placement=placement)

    def with_pipeline_defaults(self, pipeline_class: type[BasePipeline]) -> RunConfig:
        """This config with the flags whose default is the model's filled in from ``pipeline_class``: an unset
        ``--lora_target_modules`` becomes its ``default_lora_target_modules``, and ``--remove_prefix_in_ckpt`` of a
        model part (``pipe.vace.``) the prefix of the model holding it (``pipe.dit.``).

        Every run and plan calls this once it knows its pipeline, before anything reads the targets, so the run's
        records (``training_args.json``, ``config.yaml``, a checkpoint's flags) hold the layers that trained and a
        resume compares those.
        """
        lora = self.lora.with_default_targets(pipeline_class.default_lora_target_modules)
        output = self.output
        part = next((name for name in pipeline_class.model_parts if output.remove_prefix_in_ckpt == f"pipe.{name}."),
                    None)
        if part is not None:  # the weights of a model part (Wan VACE's pipe.vace.) are named in the model holding it
            output = dataclasses.replace(output, remove_prefix_in_ckpt=f"pipe.{pipeline_class.host_model(part)}.")
        if lora is self.lora and output is self.output:
            return self
        if lora is not self.lora and self.lora.lora_base_model is not None:
            logger.info("--lora_target_modules unset: %s's defaults %s", pipeline_class.__name__,
                        lora.lora_target_modules)
        return dataclasses.replace(self, lora=lora, output=output)
