"""No silently ignored input: extra inputs nothing reads, metadata columns left unread, flags without effect; and no
batch of several samples for inputs that condition one sample alone.

A reference command that names an input this pipeline or task does not use trains something else than its author
meant, and exits 0. These checks run on the flags and the pipeline's declarations before any model loads. Where the
reference's own commands pass such a flag (its split scripts repeat the image sizes and ``--extra_inputs`` in stage
2), it is a warning naming the flag; elsewhere it is an error naming the flag and the fix.

Which inputs matter is read from the unit declarations, as the split does (``unit_graph``): walking the units
backwards from the keys the task's loss reads, an input matters when a unit that produces a needed key reads it. A
``separate_cfg`` unit reads ``cfg_scale`` only for its negative-branch outputs, so guidance matters only where the
loss reads the negative branch (``direct_distill``), not for SFT.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ...diffusion.base_pipeline import BasePipeline, PipelineUnit, StateKey, unit_access
from ...diffusion.unit_graph import expand_keys
from ..config.errors import FlagError
from ..objective.loss import LOSSES

if TYPE_CHECKING:
    from ..config import RunConfig

logger = logging.getLogger(__name__)


def inputs_that_matter(units: Sequence[PipelineUnit], final_keys: Iterable[str | StateKey]) -> set[str]:
    """The shared state inputs (``--extra_inputs`` candidates) that can change a key in ``final_keys``."""
    needed = set(expand_keys(final_keys, "final_keys"))
    accesses = [unit_access(unit) for unit in units]
    for unit, access in zip(reversed(units), reversed(accesses)):
        produced = access.writes & needed
        if not produced:
            continue
        reads = set(access.reads)
        if unit.separate_cfg and not any(scope == "nega" for scope, _ in produced):
            reads -= {("shared", "cfg_scale"), *(("nega", key) for key in unit.input_params_nega.values())}
        # A declared output the unit may leave as it was is also declared as an input (pipeline_unit.py).
        needed = (needed - access.writes) | reads
    # Per-branch outputs (prompt embeddings) are read by the loss in every scope, but come from the units only.
    branch_outputs = {name for access in accesses for scope, name in access.writes if scope != "shared"}
    return {name for scope, name in needed if scope == "shared" and name not in branch_outputs}


def _used_inputs(config: RunConfig, pipeline_class: type[BasePipeline]) -> tuple[set[str], str]:
    pipe = pipeline_class()  # no models: only the units' declarations are read
    loss = LOSSES[config.training.family]
    return inputs_that_matter(pipe.units, loss.required_keys(pipe)), loss.__name__


def extra_input_problems(config: RunConfig, pipeline_class: type[BasePipeline]) -> list[str]:
    """``--extra_inputs`` names that nothing in this task reads (a stage-2 run reads none: they are cached)."""
    names, task = config.model.extra_input_names, config.training.task
    if not names or config.training.stage == "train":
        return []
    used, loss = _used_inputs(config, pipeline_class)
    unread = [name for name in names
              if name not in used and name not in (*pipeline_class.derived_inputs, *pipeline_class.media_inputs)]
    if not unread:
        return []
    return [f"--extra_inputs {config.model.extra_inputs}: {unread} would be passed to {pipeline_class.__name__} with "
            f"--task {task}, but neither its units nor {loss} read them, so they would be ignored. It reads: "
            f"{', '.join(sorted(used))}. Drop them (or, for the distillation settings seed, num_inference_steps and "
            "cfg_scale, use --task direct_distill)"]


def warn_about_unread_columns(config: RunConfig, pipeline_class: type[BasePipeline],
                              columns: Iterable[str]) -> list[str]:
    """Warns about metadata columns this task could read as inputs but ``--extra_inputs`` leaves out; returns them."""
    passed = {*config.model.extra_input_names, *pipeline_class.training_columns, *config.dataset.file_keys,
              *pipeline_class.optional_columns}
    used, _ = _used_inputs(config, pipeline_class)
    unread = sorted(column for column in columns if column in used and column not in passed)
    if unread:
        logger.warning("metadata columns %s are not read: --task %s could use them, but --extra_inputs does not "
                       "name them; add them (e.g. --extra_inputs %s) or remove the columns", unread,
                       config.training.task, ",".join(unread))
    return unread


def column_default_problems(config: RunConfig, pipeline_class: type[BasePipeline]) -> list[str]:
    """Flags that fill a column the rows lack (``--frame_rate``) must fill one this task reads; stage 2 reads the
    cache, where stage 1 applied them (a warning, as for the sizes)."""
    defaults = config.dataset.column_defaults
    if not defaults:
        return []
    if config.training.stage == "train":
        for name, value in defaults.items():
            logger.warning("--%s %s has no effect on --task %s: stage 1 applied it and the cache holds the result",
                           name, value, config.training.task)
        return []
    used, loss = _used_inputs(config, pipeline_class)
    problems = [f"--{name} {value} has no effect on {pipeline_class.__name__}: neither its units nor {loss} read a "
                f"{name} (it reads the first --num_frames frames of each clip as they are); drop --{name}"
                for name, value in defaults.items() if name not in used]
    return problems + [f"--{name} {value} has no effect: --extra_inputs {config.model.extra_inputs} makes every row "
                       f"give its own {name}; drop --{name}, or drop {name} from --extra_inputs to use it for rows "
                       "without one" for name, value in defaults.items() if name in config.model.extra_input_names]


def flag_effect_problems(config: RunConfig) -> list[str]:
    """Flags with no effect in the chosen task and mode: errors, except the warnings the reference's commands need."""
    training, flags = config.training, config.to_flags()
    task, family, stage = training.task, training.family, training.stage
    problems = []
    if family == "direct_distill" and (training.min_timestep_boundary, training.max_timestep_boundary) != (0.0, 1.0):
        problems.append(f"--min_timestep_boundary {training.min_timestep_boundary} / --max_timestep_boundary "
                        f"{training.max_timestep_boundary} have no effect on --task {task}: distillation runs the "
                        "whole sampler, it draws no timestep; drop them")
    if not config.lora.lora_base_model:
        given = [flag for flag in ("lora_checkpoint", "lora_alpha") if flags[flag] is not None]
        problems += [f"--{flag} {flags[flag]} has no effect without --lora_base_model (no LoRA is trained); "
                     "add --lora_base_model dit, or drop it" for flag in given]
    if stage == "data_process":
        given = [flag for flag in ("lora_checkpoint", "save_steps", "max_train_steps", "max_grad_norm")
                 if flags[flag] is not None]
        problems += [f"--{flag} {flags[flag]} has no effect on --task {task}, which trains nothing; "
                     f"pass it to the {family}:train run" for flag in given]
        if training.initial_weights:
            problems.append(f"--resume_from_checkpoint {training.initial_weights} (weights to train from) has no "
                            f"effect on --task {task}, which trains nothing; pass it to the {family}:train run")
    if stage == "train":
        # The reference's split scripts repeat these in stage 2, so they only warn there.
        for flag in ("height", "width", "extra_inputs"):
            if flags[flag] is not None:
                logger.warning("--%s %s has no effect on --task %s: stage 1 applied it and the cache holds the "
                               "result", flag, flags[flag], task)
    return problems


def unbatched_input_problems(config: RunConfig, pipeline_class: type[BasePipeline]) -> list[str]:
    """``--batch_size`` above 1 with extra inputs the pipeline conditions one sample on alone (``unbatched_inputs``)."""
    names = [name for name in config.model.extra_input_names if name in pipeline_class.unbatched_inputs]
    if not names or config.dataset.batch_size == 1:
        return []
    return [f"--batch_size {config.dataset.batch_size} with --extra_inputs {', '.join(names)}: {pipeline_class.__name__} "
            "conditions each sample on them alone; use --batch_size 1 (--gradient_accumulation_steps trains on as many "
            "samples per step)"]


def check_inputs_used(config: RunConfig, pipeline_class: type[BasePipeline]) -> None:
    """Refuses inputs and flags that would be silently ignored (see the module docstring).

    Raises:
        FlagError: One line per problem, each naming the flag, the value and the fix.
    """
    problems = (extra_input_problems(config, pipeline_class) + flag_effect_problems(config)
                + column_default_problems(config, pipeline_class) + unbatched_input_problems(config, pipeline_class))
    if problems:
        raise FlagError(problems)
