"""``python -m diffsynth.plan``: the memory planner's table for a training command, for a device you may not have.

    python -m diffsynth.plan --pipeline qwen-image <the training flags> --device_profile rtx4090-24gb
    python -m diffsynth.plan --pipeline wan --architecture wan2.1-t2v-14b --lora_base_model dit \\
        --height 480 --width 832 --num_frames 81 --device_profile rtx4090-24gb
    python -m diffsynth.plan --pipeline flux2-klein --architecture flux.2-klein-9b --trainable_models dit \\
        --height 1024 --width 1024 --device_profile rtx4090-24gb

Takes the trainer's flags (the model files' configs are read, no weight is loaded; ``--architecture`` plans a released
model without its files), predicts every placement on the profile and prints the table, the plan the trainer would
choose within ``--vram_budget`` (default: the profile's memory) and ``--ram_budget`` (default: unbounded), and the
flags that select it. Exits 1 when no plan fits, saying what would.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from .core.planning.plans import NoPlanFits
from .core.planning.profiles import GIB, PROFILES, profile_named
from .training.config import RunConfig, build_parser
from .training.config.parsers import parse_namespace
from .training.errors import FlagError
from .training.placement.planner import (
    ARCHITECTURES,
    DEVICE_MARGIN_BYTES,
    budget_bytes,
    build_architecture,
    build_workload,
    denoiser_skeleton,
    plan_workload,
    sample_shape,
)

PIPELINES = {"qwen-image": ("diffsynth.pipelines.qwen_image", "QwenImagePipeline", False),
             "wan": ("diffsynth.pipelines.wan_video", "WanVideoPipeline", True),
             "z-image": ("diffsynth.pipelines.z_image", "ZImagePipeline", False),
             "flux": ("diffsynth.pipelines.flux", "FluxPipeline", False),
             "flux2-klein": ("diffsynth.pipelines.flux2_klein", "Flux2KleinPipeline", False)}


def build_plan_parser(pipeline: str) -> argparse.ArgumentParser:
    """The trainer's parser for ``pipeline`` plus the planner's own options."""
    parser = build_parser("Predict the memory and step time of every placement of a training run.",
                          video=PIPELINES[pipeline][2])
    group = parser.add_argument_group("Plan")
    group.add_argument("--pipeline", choices=sorted(PIPELINES), default="qwen-image",
                       help="The model family the training flags are for.")
    group.add_argument("--device_profile", choices=sorted(PROFILES), required=True,
                       help="The device to plan for (see docs Low_VRAM for the figures and their sources).")
    group.add_argument("--architecture", choices=sorted(ARCHITECTURES), default=None,
                       help="Plan this released denoiser without its files instead of the model flags' one.")
    group.add_argument("--processes_per_machine", type=int, default=1,
                       help="GPUs (processes) training on one machine: host memory is planned for all of them, with "
                            "one shared copy of the frozen weights unless --shared_host_weights off.")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the plan table; returns 0, or 1 when no plan fits the budgets."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    pipeline = _pipeline_of(argv)
    parser = build_plan_parser(pipeline)
    try:
        args = parse_namespace(parser, argv)  # a --config file is read as the trainer reads it
        run = RunConfig.from_namespace(args, runnable=False)  # a run to plan: no dataset or model files needed
    except FlagError as error:
        parser.error("\n  " + "\n  ".join(error.problems))
    placement = run.placement
    module, class_name, _ = PIPELINES[pipeline]
    pipeline_class = getattr(__import__(module, fromlist=[class_name]), class_name)
    if args.architecture is not None and ARCHITECTURES[args.architecture][0] not in pipeline_class.model_roles:
        fitting = sorted(name for name, (cls, _) in ARCHITECTURES.items() if cls in pipeline_class.model_roles)
        parser.error(f"--architecture {args.architecture} is not a {pipeline} model; for --pipeline {pipeline} choose "
                     f"one of {fitting}, or pass the --pipeline of {args.architecture}")
    if args.architecture is not None:  # then any --fp8_models entry means the denoiser
        model, others, fp8 = build_architecture(args.architecture, run.model.torch_dtype), [], bool(run.model.fp8_models)
    else:
        model, others, fp8 = denoiser_skeleton(run, pipeline_class)
    height, width, frames = sample_shape(run)
    if args.processes_per_machine < 1:
        parser.error(f"--processes_per_machine {args.processes_per_machine} must be at least 1")
    batch_size = run.dataset.batch_size
    workload = build_workload(model, run, others, pipeline_class.lora_target_aliases,
                              f"{args.architecture or type(model).__name__}{' fp8' if fp8 else ''} at "
                              f"{width}x{height}x{frames}"
                              f"{f', batch {batch_size}' if batch_size > 1 else ''}", fp8=fp8,
                              local_processes=args.processes_per_machine)
    profile = profile_named(args.device_profile)
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


def _pipeline_of(argv: Sequence[str]) -> str:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--pipeline", choices=sorted(PIPELINES), default="qwen-image")
    return pre.parse_known_args(argv)[0].pipeline


if __name__ == "__main__":
    sys.exit(main())
