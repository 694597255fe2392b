"""``python -m diffsynth.plan``: the memory planner's table for a training command, for a device you may not have.

    python -m diffsynth.plan --pipeline qwen-image <the training flags> --device_profile rtx4090-24gb
    python -m diffsynth.plan --pipeline wan --architecture wan2.1-t2v-14b --lora_base_model dit \\
        --height 480 --width 832 --num_frames 81 --device_profile rtx4090-24gb
    python -m diffsynth.plan --pipeline flux2-klein --architecture flux.2-klein-9b --trainable_models dit \\
        --height 1024 --width 1024 --device_profile rtx4090-24gb
    python -m diffsynth.plan --pipeline qwen-image --architecture qwen-image --trainable_models dit \\
        --customized_optimizer bitsandbytes.optim.AdamW8bit --fused_optimizer_step --height 1024 --width 1024 \\
        --device_profile rtx4090-24gb --ram_budget 128

Takes the trainer's flags (the model files' configs are read, no weight is loaded, nothing is downloaded;
``--architecture`` plans a released model without its files, and so does a command whose files are not on disk when
its model ids name a release: the families' ``releases``), predicts every placement on the profile and prints the table,
the plan the trainer would choose within ``--vram_budget`` (default: the profile's memory) and ``--ram_budget``
(default: unbounded), and the flags that select it; a full fine-tune is planned with its optimizer's state
(``--customized_optimizer``), ``--ema_decay`` and ``--fused_optimizer_step``. Exits 1 when no plan fits, saying what
would; 2 with one message for flags or model files to fix (``--debug`` adds the traceback).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .core.library_notices import quiet_library_notices
from .core.loader import ModelConfigError, ModelFilesNotFoundError, parse_model_id_with_origin_paths
from .core.loader.resolve import local_repo_dir
from .core.planning.plans import NoPlanFits
from .core.planning.profiles import GIB, PROFILES, profile_named
from .core.unused_libraries import keep_out
from .pipelines.registry import family_of_plan_name, plan_names, released_architecture, releases
from .training.config import RunConfig, build_parser
from .training.config.errors import FlagError
from .training.config.parsers import parse_namespace, uses_bitsandbytes
from .training.exit_codes import BAD_INPUT, debug_requested
from .training.placement.planner import (
    DEVICE_MARGIN_BYTES,
    budget_bytes,
    build_architecture,
    build_workload,
    denoiser_skeleton,
    plan_workload,
    repo_files_missing,
    sample_shape,
)

if TYPE_CHECKING:
    from torch import nn

DEFAULT_PIPELINE = "qwen-image"
"""The ``--pipeline`` planned when none is given (the README's first command)."""

def build_plan_parser(pipeline: str) -> argparse.ArgumentParser:
    """The trainer's parser for ``pipeline`` plus the planner's own options."""
    parser = build_parser("Predict the memory and step time of every placement of a training run.",
                          video=family_of_plan_name(pipeline).video)
    group = parser.add_argument_group("Plan")
    group.add_argument("--pipeline", choices=plan_names(), default=DEFAULT_PIPELINE,
                       help="The model family the training flags are for.")
    group.add_argument("--device_profile", choices=sorted(PROFILES), required=True,
                       help="The device to plan for (see docs Low_VRAM for the figures and their sources).")
    group.add_argument("--architecture", choices=sorted(releases()), default=None,
                       help="Plan this released denoiser without its files instead of the model flags' one.")
    group.add_argument("--processes_per_machine", type=int, default=1,
                       help="GPUs (processes) training on one machine: host memory is planned for all of them, with "
                            "one shared copy of the frozen weights unless --shared_host_weights off.")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the plan table; returns 0, 1 when no plan fits the budgets, or 2 after one line on stderr for flags or
    model files to fix."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    own_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    quiet_library_notices(debug_requested(argv))
    try:
        return _plan(argv, own_command_line)
    except (FlagError, ModelConfigError, ModelFilesNotFoundError) as error:
        if debug_requested(argv):
            raise
        print(f"error: {error}", file=sys.stderr)
        return BAD_INPUT


def _plan(argv: list[str], own_command_line: bool) -> int:
    pipeline = _pipeline_of(argv)
    parser = build_plan_parser(pipeline)
    args = parse_namespace(parser, argv)  # a --config file is read as the trainer reads it
    if own_command_line and not uses_bitsandbytes(args):
        keep_out("bitsandbytes")  # planned on the meta device: the library is only named, never run
    run = RunConfig.from_namespace(args, runnable=False)  # a run to plan: no dataset or model files needed
    if args.processes_per_machine < 1:
        raise FlagError([f"--processes_per_machine {args.processes_per_machine} must be at least 1"])
    pipeline_class = family_of_plan_name(pipeline).pipeline_class()
    run = run.with_pipeline_defaults(pipeline_class)
    model, others, fp8, name = _denoiser(args.architecture, run, pipeline, pipeline_class)
    height, width, frames = sample_shape(run.dataset)
    batch_size = run.dataset.batch_size
    workload = build_workload(model, run, others, pipeline_class.lora_target_aliases,
                              f"{name}{' fp8' if fp8 else ''} at {width}x{height}x{frames}"
                              f"{f', batch {batch_size}' if batch_size > 1 else ''}", fp8=fp8,
                              local_processes=args.processes_per_machine, scope=pipeline_class.part_scope)
    profile = profile_named(args.device_profile)
    placement = run.placement
    vram = budget_bytes(placement.vram_budget or "auto", "vram_budget", profile.memory_bytes - DEVICE_MARGIN_BYTES)
    ram = budget_bytes(placement.ram_budget, "ram_budget", None)
    try:
        report = plan_workload(workload, placement, profile, vram, ram)
    except NoPlanFits as error:
        print(f"{workload.description} on {profile.name}: {error}")
        return 1
    print(f"{workload.description}, {workload.model_bytes / GIB:.1f} GiB of weights, "
          f"{workload.trainable_bytes / GIB:.2f} GiB trainable")
    print(report.format())
    chosen = report.chosen
    print(f"{'flags given' if report.explicit else 'chosen'}: {chosen.plan.describe()}, checkpointing "
          f"{chosen.plan.checkpointing}: {' '.join(chosen.plan.flags()) or '(no placement flags)'}")
    return 0


def _denoiser(architecture: str | None, run: RunConfig, pipeline: str,
              pipeline_class: type) -> tuple[nn.Module, list[int], bool, str]:
    """The denoiser to plan, the sizes of the other models a step runs, whether it is in fp8, and its name: from the
    model files on disk, else from the released architecture that ``--architecture`` or the model ids name."""
    named_by, note, choices = f"--architecture {architecture}", None, ", ".join(_architectures_of(pipeline_class))
    if architecture is None:
        missing = repo_files_missing(run.model)
        if not missing:
            model, others, fp8 = denoiser_skeleton(run, pipeline_class, download=False)
            return model, others, fp8, type(model).__name__
        ids = ", ".join(dict.fromkeys(config.model_id for config in missing))
        folders = ", ".join(dict.fromkeys(str(local_repo_dir(config)) for config in missing))
        architecture = released_architecture(
            config.model_id for config in parse_model_id_with_origin_paths(run.model.model_id_with_origin_paths))
        if architecture is None:
            unknown = (f"--model_id_with_origin_paths: the files of {ids} are not on disk (under {folders}), the "
                       "planner downloads nothing, and these ids name no release it knows; pass --architecture with "
                       f"one of {choices} to plan a released denoiser, or put the files under {folders}")
            raise FlagError([unknown])
        named_by = f"--model_id_with_origin_paths names the release {architecture}, which"
        note = (f"the files of {ids} are not on disk (under {folders}): planned from the released {architecture} "
                "config, the denoiser alone (as when training from a stage-1 cache)")
    if releases()[architecture][0].denoiser_class not in pipeline_class.model_roles:
        other = (f"{named_by} is not a {pipeline} model; for --pipeline {pipeline} choose one of {choices}, or pass "
                 f"the --pipeline of {architecture}")
        raise FlagError([other])
    if note:  # before the table: its figures are the release's, not those of the user's files
        print(note)
    # Any --fp8_models entry then means the denoiser.
    return build_architecture(architecture, run.model.torch_dtype), [], bool(run.model.fp8_models), architecture


def _architectures_of(pipeline_class: type) -> list[str]:
    return sorted(name for name, (spec, _) in releases().items() if spec.denoiser_class in pipeline_class.model_roles)


def _pipeline_of(argv: Sequence[str]) -> str:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--pipeline", choices=plan_names(), default=DEFAULT_PIPELINE)
    return pre.parse_known_args(argv)[0].pipeline


if __name__ == "__main__":
    sys.exit(main())
