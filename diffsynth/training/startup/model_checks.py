"""Checks of the flags that name models or their parts, made on weightless builds before any weight loads.

``--lora_base_model``, ``--trainable_models``, ``--lora_target_modules``, ``--fp8_models`` (also against
``--use_dora``), ``--blocks_to_swap``,
``--preset_lora_model`` / ``--preset_lora_path``, the exclusions of ``--quant_options`` and a weights file given as
``--resume_from_checkpoint`` can only be checked against the models themselves. Loading a 20B-parameter pipeline takes
minutes, so each model's slot is read from its ``config.json`` and the models whose structure matters (the LoRA's
model, the denoiser, the preset LoRA's and the quantized models) are built on the meta device (``load_skeleton``: a
second or so, no weights); every problem is then reported at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ...core.finite import NonFiniteTensorError
from ...core.loader import (
    ModelConfig,
    ModelLoadError,
    load_skeleton,
    model_class_name,
    parse_model_id_with_origin_paths,
)
from ...core.offload_training.block_swap import find_block_sequence
from ...diffusion.base_pipeline import BasePipeline
from ..config.errors import FlagError
from ..objective.lora_targets import effective_lora_targets, resolve_lora_targets
from ..outputs.initial_weights import initial_weights_problems, target_model
from ..placement.quant_options import quant_model_problems, quantized_models

if TYPE_CHECKING:
    from ..config import RunConfig


def _slots(pipeline_class: type[BasePipeline], configs: Sequence[ModelConfig]) -> dict[str, ModelConfig]:
    """The pipeline slot of each config whose model class the pipeline knows (tokenizers and unknown classes are
    left to the real load, which reports them)."""
    names = []
    for config in configs:
        try:
            names.append(model_class_name(config))
        except ModelLoadError:
            names.append(None)
    # slots_of, as loading assigns them: Wan2.2 A14B's second transformer is dit2.
    return {slot: config for config, slot in zip(configs, pipeline_class.slots_of(names)) if slot is not None}


def _unknown_names(flag: str, value: str, names: Sequence[str], slots: dict[str, ModelConfig]) -> list[str]:
    unknown = [name for name in names if name not in slots]
    if not unknown:
        return []
    loaded = ", ".join(sorted(slots)) or "none"
    return [f"{flag} {value}: {unknown} name no loaded model (the models loaded are: {loaded}); name one of them, "
            "or load the model with --model_id_with_origin_paths / --model_paths"]


def _fp8_problems(run: RunConfig, configs: Sequence[ModelConfig], slots: dict[str, ModelConfig],
                  trains: bool) -> list[str]:
    if not run.model.fp8_models:
        return []
    wanted = parse_model_id_with_origin_paths(run.model.fp8_models)
    unmatched = [config.describe() for config in wanted if config not in configs]
    problems = []
    if unmatched:
        problems.append(f"--fp8_models entries {unmatched} are not among the models loaded; copy them exactly from "
                        "--model_id_with_origin_paths")
    full = [name for name, config in slots.items() if config in wanted and name in run.training.trainable]
    if trains and full:
        problems.append(f"--fp8_models includes {full}, which --trainable_models trains in full; fp8 storage is for "
                        "frozen weights: drop one of the two (a LoRA on an fp8 model trains)")
    return problems


def _dora_problems(run: RunConfig, slots: dict[str, ModelConfig], quantized: set[str]) -> list[str]:
    """DoRA on a model stored in fp8 or 4-bit: peft's DoRA reads the base weight's row norms every step, which it
    cannot do from fp8 or quantized storage. Which slot an entry fills is known only from its files' config, so this
    is checked here rather than with the flags."""
    name = run.lora.lora_base_model
    if not run.lora.use_dora or name not in slots:
        return []
    fp8 = run.model.fp8_models and slots[name] in parse_model_id_with_origin_paths(run.model.fp8_models)
    if not fp8 and name not in quantized:
        return []
    flag, value = ("--fp8_models", run.model.fp8_models) if fp8 else ("--quant_options", run.model.quant_options)
    return [f"--use_dora with --lora_base_model {name}, whose weights {flag} {value} stores compressed: DoRA reads "
            f"the base weights as they are every step; drop --use_dora (a plain LoRA trains on {flag}), or drop "
            f"{name}'s entry from {flag}"]


def _block_swap_problems(blocks_to_swap: int, denoisers: dict[str, torch.nn.Module]) -> list[str]:
    """``--blocks_to_swap`` counts over the whole block sequence block swap manages (FLUX: its double blocks, then
    its single ones), so it may not exceed that sequence's length."""
    problems = []
    for name, model in denoisers.items():
        try:
            blocks = find_block_sequence(model)
        except ValueError:
            problems.append(f"--blocks_to_swap {blocks_to_swap}: {name} ({type(model).__name__}) has no block list "
                            "to swap; drop --blocks_to_swap")
            continue
        if blocks_to_swap > len(blocks):
            problems.append(f"--blocks_to_swap {blocks_to_swap}, but {name} ({type(model).__name__}) has only "
                            f"{len(blocks)} blocks in {blocks.label}; pass at most --blocks_to_swap {len(blocks)}")
    return problems


def _skeletons(names: set[str | None], slots: dict[str, ModelConfig], torch_dtype: str) -> dict[str, torch.nn.Module]:
    """Weightless builds of the named models that are loaded (a model that cannot be built is left to the real load,
    which reports it with its files)."""
    built = {}
    for name in sorted(name for name in names if name in slots):
        try:
            built[name] = load_skeleton(slots[name], torch_dtype=torch_dtype)
        except ModelLoadError:
            continue
    return built


def _preset_lora_problems(run: RunConfig, slots: dict[str, ModelConfig], trains: bool,
                          model: torch.nn.Module | None) -> list[str]:
    """The preset LoRA must fit its model; stage 1 may leave that model out (it never computes with it)."""
    name = run.lora.preset_lora_model
    if not run.lora.preset_lora_path or (name not in slots and not trains):
        return []
    problems = _unknown_names("--preset_lora_model", name, [name], slots)
    if model is not None:
        from ...lora import check_lora

        try:
            check_lora(model, run.lora.preset_lora_path)
        except NonFiniteTensorError as error:  # exit code 3, as through --lora_checkpoint: not a flag to fix
            raise NonFiniteTensorError(f"--preset_lora_path {run.lora.preset_lora_path}: {error}",
                                       error.names) from None
        except (FileNotFoundError, ValueError) as error:
            problems.append(f"--preset_lora_path {run.lora.preset_lora_path} cannot be merged into {name} "
                            f"({type(model).__name__}): {error}")
    return problems


def _initial_weights_problems(run: RunConfig, slots: dict[str, ModelConfig]) -> list[str]:
    """A weights file (``--resume_from_checkpoint FILE``) must name weights of the model the prefix names."""
    target = target_model(run.output.remove_prefix_in_ckpt or "")
    if target is not None and target not in slots:
        return [f"--resume_from_checkpoint {run.training.initial_weights} loads into {target} "
                f"(--remove_prefix_in_ckpt {run.output.remove_prefix_in_ckpt}), which is not loaded; load it, or pass "
                "the prefix of the model the file holds"]
    names = {target} if target is not None else set(slots)
    return initial_weights_problems(run.training.initial_weights, run.output.remove_prefix_in_ckpt or "",
                                    _skeletons(names, slots, run.model.torch_dtype))


def _lora_target_problems(run: RunConfig, pipeline_class: type[BasePipeline],
                          model: torch.nn.Module | None) -> list[str]:
    if model is None:
        return []
    targets = effective_lora_targets(model, run.lora.targets, pipeline_class)
    if not targets:
        return [f"--lora_base_model {run.lora.lora_base_model} needs --lora_target_modules, e.g. "
                "'to_q,to_k,to_v,to_out.0'"]
    try:
        resolve_lora_targets(model, targets, pipeline_class.lora_target_aliases, run.lora.lora_base_model,
                             pipeline_class.part_scope(run.lora.lora_base_model, model))
    except ValueError as error:
        return [str(error)]
    return []


def _sampling_problems(run: RunConfig, pipeline_class: type[BasePipeline],
                       slots: dict[str, ModelConfig]) -> list[str]:
    """Samples while training render with the text encoder and the VAE besides the denoiser: they must be loaded
    (as weightless skeletons in a split run's stage 2: they are loaded from their files while rendering)."""
    if not run.validation.validation_prompts:
        return []
    missing = [name for name in ("text_encoder", "vae", *pipeline_class.denoising_model_names) if name not in slots]
    if not missing:
        return []
    return [f"--validation_prompts renders with {', '.join(missing)}, which no --model_id_with_origin_paths / "
            f"--model_paths entry loads (the models loaded are: {', '.join(sorted(slots)) or 'none'}); add them (in a "
            "*:train stage also to --offload_models: no weights while training, loaded while rendering)"]


def check_model_flags(run: RunConfig, pipeline_class: type[BasePipeline],
                      configs: Sequence[ModelConfig]) -> None:
    """Checks the model-naming flags against the models ``configs`` name, without loading any weight.

    Call it once the model files are resolved (``config.json`` is read) and before the pipeline loads. Stage 1
    (``*:data_process``) trains nothing and swaps no block, and may leave the trained model out, so only
    ``--fp8_models`` and a preset LoRA whose model is loaded are checked there.

    Raises:
        FlagError: One line per problem, each naming the flag, the value and the fix.
        NonFiniteTensorError: The preset LoRA holds NaN or inf values (exit code 3, as every such file).
    """
    trains = run.training.stage != "data_process"
    slots = _slots(pipeline_class, configs)
    problems = _fp8_problems(run, configs, slots, trains)
    preset = run.lora.preset_lora_model if run.lora.preset_lora_path else None
    quantized = set(quantized_models(run.model.quant_options, slots)) if run.model.quant_options else set()
    skeletons = _skeletons({preset, *quantized}, slots, run.model.torch_dtype)
    problems += _preset_lora_problems(run, slots, trains, skeletons.get(preset))
    if run.model.quant_options:
        problems += quant_model_problems(run.model, run.training.trainable, configs, slots, trains,
                                         {name: skeletons[name] for name in quantized if name in skeletons})
    if trains:
        # A model part (Wan VACE's vace) is checked on the model that holds it.
        trainable = [pipeline_class.host_model(name) for name in run.training.trainable]
        problems += _unknown_names("--trainable_models", run.training.trainable_models, trainable, slots)
        lora_model = pipeline_class.host_model(run.lora.lora_base_model) if run.lora.lora_base_model else None
        if lora_model:
            problems += _unknown_names("--lora_base_model", run.lora.lora_base_model, [lora_model], slots)
        denoisers = pipeline_class.denoising_model_names if run.placement.blocks_to_swap else ()
        wanted = {lora_model, *denoisers} - set(skeletons)
        skeletons.update(_skeletons(wanted, slots, run.model.torch_dtype))
        problems += _dora_problems(run, slots, quantized)
        problems += _lora_target_problems(run, pipeline_class, skeletons.get(lora_model))
        problems += _block_swap_problems(run.placement.blocks_to_swap, {name: skeletons[name] for name in denoisers
                                                               if name in skeletons})
        problems += _sampling_problems(run, pipeline_class, slots)
    if trains and run.training.initial_weights:
        problems += _initial_weights_problems(run, slots)
    if problems:
        raise FlagError(problems)
