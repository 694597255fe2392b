"""The output section: where checkpoints, LoRA files and logs go, how often they are written, and the loggers."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from .errors import split_csv
from .section import Section

# The layouts of a model trained in full (outputs/full_model.py writes them; named here, where the flag is parsed).
FULL_CHECKPOINT_FORMATS = ("flat", "diffusers", "original")
#: ``--full_checkpoint_format``'s default: flat and diffusers, or flat alone where a model trained in full has a LoRA.
AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class OutputSection(Section):
    """The output and metric-logging flags."""

    output_path: str = "./output"
    overwrite_output: bool = False
    remove_prefix_in_ckpt: str | None = "pipe.dit."
    full_checkpoint_format: str = "auto"
    save_steps: int | None = None
    checkpoint_every_minutes: float = 30.0
    checkpoints_total_limit: int = 2
    enable_tensorboard_log: bool = False
    enable_csv_log: bool = False
    enable_wandb_log: bool = False
    wandb_project: str = "diffsynth"

    LOWER_BOUNDS = (
        ("save_steps", 1, True, "--save_steps 500, or drop it to save once per epoch"),
        ("checkpoints_total_limit", 1, True, "--checkpoints_total_limit 2"),
        ("checkpoint_every_minutes", 0, True, "--checkpoint_every_minutes 30, or 0 for no timed checkpoints"),
    )

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, video: bool = False) -> None:
        """Adds the Output and Logging groups."""
        group = parser.add_argument_group("Output")
        group.add_argument("--output_path", type=str, default="./output",
                           help="Folder for checkpoints, LoRA files, logs and training_args.json (for a *:data_process "
                                "task, the stage-1 cache). One run at a time: a lock file refuses a second run while "
                                "one is writing there. Not the model folder (./models).")
        group.add_argument("--overwrite_output", action="store_true",
                           help="Start afresh in an --output_path that holds an earlier run's outputs: removes, "
                                "before starting, exactly the files that earlier runs of the trainer recorded writing "
                                "there (in .diffsynth/written/; LoRA files, checkpoints, samples, logs, "
                                "training_args.json, config.yaml; for *:data_process the cache) and that are unchanged "
                                "since, then the folders left empty. Every other file is kept byte for byte, e.g. "
                                "yours inside samples/ or checkpoints/, or another tool's epoch-3.safetensors. Without "
                                "it such a folder is refused, unless --resume_from_checkpoint continues the run.")
        group.add_argument("--remove_prefix_in_ckpt", type=str, default="pipe.dit.",
                           help="Prefix removed from the weight names saved, so files load into the bare model.")
        group.add_argument("--full_checkpoint_format", type=str, default="auto",
                           help="What each save point writes for a model trained in full (--trainable_models): auto "
                                "(flat and diffusers; flat alone for a model that also carries a LoRA), or a comma "
                                "list of: flat (<name>.safetensors, the weights with --remove_prefix_in_ckpt removed, "
                                "for DiffSynth-Studio), diffusers (<name>.<model>/: config.json and sharded "
                                "safetensors that from_pretrained and --model_paths load), original (the original "
                                "release's layout, for ComfyUI: FLUX.1 <name>.<model>.original.safetensors, Wan "
                                "<name>.<model>.original/; not for Qwen-Image, Z-Image, FLUX.2, whose release is the "
                                "diffusers folder). Written block by block, under ZeRO-3 without gathering the model "
                                "whole.")
        group.add_argument("--save_steps", type=int, default=None,
                           help="Also write a LoRA file and a training-state checkpoint every N optimizer steps; unset "
                                "writes them at the end of each epoch.")
        group.add_argument("--checkpoint_every_minutes", type=float, default=30.0,
                           help="Also write a training-state checkpoint (for --resume_from_checkpoint, not a LoRA "
                                "file) once this many minutes have passed since the last one, so a crash or preemption "
                                "loses at most that much work; 0 turns it off.")
        group.add_argument("--checkpoints_total_limit", type=int, default=2,
                           help="Training-state checkpoints (for --resume_from_checkpoint) kept in "
                                "output_path/checkpoints; older ones are deleted. LoRA files are always kept.")
        group = parser.add_argument_group("Logging")
        group.add_argument("--enable_tensorboard_log", action="store_true",
                           help="Write TensorBoard events under <output_path>/logs (needs: pip install tensorboard).")
        group.add_argument("--enable_csv_log", action="store_true",
                           help="Append step, loss, learning rate and the running count of skipped non-finite steps "
                                "to <output_path>/logs/metrics.csv.")
        group.add_argument("--enable_wandb_log", action="store_true",
                           help="Log metrics to Weights & Biases (needs: pip install wandb).")
        group.add_argument("--wandb_project", type=str, default="diffsynth", help="Weights & Biases project name.")

    @property
    def full_checkpoint_formats(self) -> tuple[str, ...]:
        """``--full_checkpoint_format`` as a tuple, e.g. ``("flat", "diffusers")``."""
        return tuple(split_csv(self.full_checkpoint_format))

    def problems(self) -> list[str]:
        problems = super().problems()
        formats = self.full_checkpoint_formats
        unknown = [layout for layout in formats if layout not in (*FULL_CHECKPOINT_FORMATS, AUTO)]
        if AUTO in formats and len(formats) > 1:
            problems.append(f"--full_checkpoint_format {self.full_checkpoint_format!r}: auto picks the formats itself; "
                            "pass auto alone, or a list of the formats such as flat,diffusers")
        if unknown or not formats:
            problems.append(f"--full_checkpoint_format {self.full_checkpoint_format!r}: expected a comma list of "
                            f"{', '.join(FULL_CHECKPOINT_FORMATS)} (e.g. flat,diffusers)"
                            + (f"; {', '.join(map(repr, unknown))} is not one" if unknown else ""))
        if Path(self.output_path).is_file():
            problems.append(f"--output_path {self.output_path!r} is a file, but checkpoints go into a folder; pass a "
                            f"folder path (it is created if missing)")
        return problems
