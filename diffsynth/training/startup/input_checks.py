"""No silently ignored input: extra inputs nothing reads, metadata columns left unread, flags without effect.

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

import argparse
import logging
from collections.abc import Iterable, Sequence

from ...diffusion.base_pipeline import BasePipeline, PipelineUnit, StateKey, unit_access
from ...diffusion.unit_graph import expand_keys
from ..errors import FlagError, split_csv, task_stage
from ..objective.loss import LOSSES

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


def _used_inputs(args: argparse.Namespace, pipeline_class: type[BasePipeline]) -> tuple[set[str], str]:
    family, _ = task_stage(args.task)
    pipe = pipeline_class()  # no models: only the units' declarations are read
    loss = LOSSES[family]
    return inputs_that_matter(pipe.units, loss.required_keys(pipe)), loss.__name__


def extra_input_problems(args: argparse.Namespace, pipeline_class: type[BasePipeline]) -> list[str]:
    """``--extra_inputs`` names that nothing in this task reads (a stage-2 run reads none: they are cached)."""
    names = split_csv(args.extra_inputs)
    if not names or task_stage(args.task)[1] == "train":
        return []
    used, loss = _used_inputs(args, pipeline_class)
    unread = [name for name in names if name not in used and name not in pipeline_class.derived_inputs]
    if not unread:
        return []
    return [f"--extra_inputs {args.extra_inputs}: {unread} would be passed to {pipeline_class.__name__} with --task "
            f"{args.task}, but neither its units nor {loss} read them, so they would be ignored. It reads: "
            f"{', '.join(sorted(used))}. Drop them (or, for the distillation settings seed, num_inference_steps and "
            "cfg_scale, use --task direct_distill)"]


def warn_about_unread_columns(args: argparse.Namespace, pipeline_class: type[BasePipeline],
                              columns: Iterable[str]) -> list[str]:
    """Warns about metadata columns this task could read as inputs but ``--extra_inputs`` leaves out; returns them."""
    passed = {*split_csv(args.extra_inputs), *pipeline_class.training_columns, *split_csv(args.data_file_keys)}
    used, _ = _used_inputs(args, pipeline_class)
    unread = sorted(column for column in columns if column in used and column not in passed)
    if unread:
        logger.warning("metadata columns %s are not read: --task %s could use them, but --extra_inputs does not "
                       "name them; add them (e.g. --extra_inputs %s) or remove the columns", unread, args.task,
                       ",".join(unread))
    return unread


def flag_effect_problems(args: argparse.Namespace) -> list[str]:
    """Flags with no effect in the chosen task and mode: errors, except the warnings the reference's commands need."""
    family, stage = task_stage(args.task)
    problems = []
    if family == "direct_distill" and (args.min_timestep_boundary, args.max_timestep_boundary) != (0.0, 1.0):
        problems.append(f"--min_timestep_boundary {args.min_timestep_boundary} / --max_timestep_boundary "
                        f"{args.max_timestep_boundary} have no effect on --task {args.task}: distillation runs the "
                        "whole sampler, it draws no timestep; drop them")
    if not args.lora_base_model:
        given = [flag for flag in ("lora_checkpoint", "lora_alpha") if getattr(args, flag) is not None]
        problems += [f"--{flag} {getattr(args, flag)} has no effect without --lora_base_model (no LoRA is trained); "
                     "add --lora_base_model dit, or drop it" for flag in given]
    if stage == "data_process":
        given = [flag for flag in ("lora_checkpoint", "save_steps", "max_train_steps", "max_grad_norm")
                 if getattr(args, flag) is not None]
        problems += [f"--{flag} {getattr(args, flag)} has no effect on --task {args.task}, which trains nothing; "
                     f"pass it to the {family}:train run" for flag in given]
        if getattr(args, "initial_weights", None):
            problems.append(f"--resume_from_checkpoint {args.initial_weights} (weights to train from) has no effect "
                            f"on --task {args.task}, which trains nothing; pass it to the {family}:train run")
    if stage == "train":
        # The reference's split scripts repeat these in stage 2, so they only warn there.
        given = [flag for flag in ("height", "width", "extra_inputs") if getattr(args, flag) is not None]
        for flag in given:
            logger.warning("--%s %s has no effect on --task %s: stage 1 applied it and the cache holds the result",
                           flag, getattr(args, flag), args.task)
    return problems


def check_inputs_used(args: argparse.Namespace, pipeline_class: type[BasePipeline]) -> None:
    """Refuses inputs and flags that would be silently ignored (see the module docstring).

    Raises:
        FlagError: One line per problem, each naming the flag, the value and the fix.
    """
    problems = extra_input_problems(args, pipeline_class) + flag_effect_problems(args)
    if problems:
        raise FlagError(problems)
