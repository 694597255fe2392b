"""The training section: the task, the optimizer and its schedule, the step budget, precision and resuming."""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import TASKS, split_csv, task_stage
from .optimizer_names import is_paged_optimizer, resolve_optimizer_class, unpaged_optimizer
from .reference_flags import UNSUPPORTED_TASKS
from .section import Section

if TYPE_CHECKING:
    from .placement import PlacementConfig

LR_SCHEDULERS = ("constant", "linear", "cosine", "constant_with_warmup")
MIXED_PRECISIONS = ("no", "fp16", "bf16")


@dataclasses.dataclass(frozen=True)
class TrainingSection(Section):
    """The optimisation flags.

    ``--resume_from_checkpoint`` has two meanings, told apart by what it names (``outputs.initial_weights``): a
    training-state folder or ``latest`` (:attr:`resume_checkpoint`) or a ``.safetensors`` weights file to start
    from (:attr:`initial_weights`).
    """

    learning_rate: float = 1e-4
    num_epochs: int = 1
    trainable_models: str | None = None
    find_unused_parameters: bool = False
    weight_decay: float = 0.01
    customized_optimizer: str | None = None
    task: str = "sft"
    gradient_accumulation_steps: int = 1
    seed: int | None = None
    lr_scheduler: str = "constant"
    lr_warmup_steps: int = 0
    max_grad_norm: float | None = None
    mixed_precision: str = "no"
    resume_from_checkpoint: str | None = None
    min_timestep_boundary: float = 0.0
    max_timestep_boundary: float = 1.0
    max_train_steps: int | None = None
    max_nonfinite_steps: int = 3
    ema_decay: float | None = None
    fused_optimizer_step: bool = False

    LOWER_BOUNDS = (
        ("learning_rate", 0, False, "--learning_rate 1e-4"),
        ("num_epochs", 1, True, "--num_epochs 1"),
        ("gradient_accumulation_steps", 1, True, "--gradient_accumulation_steps 1"),
        ("lr_warmup_steps", 0, True, "--lr_warmup_steps 0 for no warm-up"),
        ("max_train_steps", 1, True, "--max_train_steps 1000, or drop it to run all epochs"),
        ("max_grad_norm", 0, False, "--max_grad_norm 1.0, or drop it to clip nothing"),
        ("weight_decay", 0, True, "--weight_decay 0.01"),
        ("max_nonfinite_steps", 1, True, "--max_nonfinite_steps 3"),
    )
    EXAMPLES = {"min_timestep_boundary": "--min_timestep_boundary 0",
                "max_timestep_boundary": "--max_timestep_boundary 1", "ema_decay": "--ema_decay 0.999"}

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, video: bool = False) -> None:
        """Adds the Training group."""
        group = parser.add_argument_group("Training")
        group.add_argument("--learning_rate", type=float, default=1e-4, help="Peak learning rate of the optimizer.")
        group.add_argument("--num_epochs", type=int, default=1, help="Epochs to train.")
        group.add_argument("--trainable_models", type=str, default=None,
                           help="Comma list of pipeline models trained in full (e.g. dit); unset trains only the LoRA.")
        group.add_argument("--find_unused_parameters", action="store_true",
                           help="Let DDP tolerate parameters that get no gradient; costs a graph walk per step.")
        group.add_argument("--weight_decay", type=float, default=0.01, help="Weight decay of the optimizer.")
        group.add_argument("--customized_optimizer", type=str, default=None,
                           help="Optimizer class by dotted path, e.g. torch.optim.Adam or bitsandbytes.optim.AdamW8bit "
                                "(pip install bitsandbytes), built with --learning_rate and --weight_decay; unset uses "
                                "torch.optim.AdamW (DeepSpeed's CPU Adam when ZeRO offloads the optimizer). Checked to "
                                "import before any model loads; a resume needs the optimizer its checkpoint was made "
                                "with. bitsandbytes.optim.AdamW8bit keeps both Adam moments in 8 bits (a quarter of "
                                "AdamW's state; runs on the CPU too); the Paged* classes page that state between GPU "
                                "and host memory and need CUDA with the weights trained on the GPU.")
        # The reference's tasks refused here parse, to be refused with their reason (reference_flags).
        group.add_argument("--task", type=str, default="sft", choices=(*TASKS, *UNSUPPORTED_TASKS),
                           help="Training task; a :data_process / :train suffix runs one stage of split training.")
        group.add_argument("--gradient_accumulation_steps", type=int, default=1,
                           help="Batches per optimizer step; more steps give a larger effective batch at no VRAM cost.")
        group.add_argument("--seed", type=int, default=None,
                           help="Seed of the random number generators; unset leaves them unseeded, as the reference "
                                "trainer does. Set it for a reproducible run.")
        group.add_argument("--lr_scheduler", type=str, default="constant", choices=LR_SCHEDULERS,
                           help="Learning-rate schedule over the optimizer steps.")
        group.add_argument("--lr_warmup_steps", type=int, default=0,
                           help="Optimizer steps of linear warm-up; needs a schedule other than constant.")
        group.add_argument("--max_grad_norm", type=float, default=None,
                           help="Clip the gradient norm to this value; unset clips nothing, as the reference trainer "
                                "(under DeepSpeed it sets an auto gradient_clipping, which is 1.0 unset).")
        group.add_argument("--mixed_precision", type=str, default="no", choices=MIXED_PRECISIONS,
                           help="Mixed precision passed to accelerate's Accelerator; no trains in the weights' dtype.")
        group.add_argument("--resume_from_checkpoint", type=str, default=None,
                           help='A training-state folder, or "latest" for the newest one in --output_path: resumes the '
                                "whole run (weights, optimizer, schedule, data position). A .safetensors weights file "
                                "(the reference's meaning, e.g. a full fine-tune's epoch-4.safetensors): starts from "
                                "those weights, loaded into the model --remove_prefix_in_ckpt names (pipe.dit.: the "
                                "transformer), with a fresh optimizer.")
        group.add_argument("--min_timestep_boundary", type=float, default=0.0,
                           help="Lower end of the drawn training timesteps, as a fraction of the noisiest-first grid.")
        group.add_argument("--max_timestep_boundary", type=float, default=1.0,
                           help="Upper end of the drawn training timesteps; e.g. 0.5 trains on the noisier half only.")
        group.add_argument("--max_train_steps", type=int, default=None,
                           help="Stop after this many optimizer steps, even within an epoch; unset runs all epochs.")
        group.add_argument("--max_nonfinite_steps", type=int, default=3,
                           help="A step whose loss or gradient norm is NaN or inf is skipped (no update) and counted; "
                                "after this many such steps in a row training stops with exit code 3, naming the "
                                "samples and the last checkpoint.")
        group.add_argument("--ema_decay", type=float, default=None,
                           help="Keep an exponential moving average of the trained weights (fp32, in host memory, "
                                "main process only), updated after every applied step as ema = D*ema + (1-D)*weight; "
                                "each weights file gets a <name>-ema twin and checkpoints hold it for resuming. "
                                "0 < D < 1, e.g. 0.999; unset keeps none.")
        group.add_argument("--fused_optimizer_step", action="store_true",
                           help="Update each weight as soon as its gradient is complete in backward and free the "
                                "gradient at once, so the gradients of all weights never exist together (saves "
                                "about the trained weights' size at the peak; costs one optimizer call per weight). "
                                "One process, --gradient_accumulation_steps 1, no --max_grad_norm, no fp16, no "
                                "DeepSpeed or block swap.")

    @property
    def family(self) -> str:
        """The task family: ``sft`` or ``direct_distill``."""
        return task_stage(self.task)[0]

    @property
    def stage(self) -> str | None:
        """The split-training stage: ``data_process``, ``train``, or None for an unsplit run."""
        return task_stage(self.task)[1]

    @property
    def trains(self) -> bool:
        """Whether this stage trains (stage 1 only caches)."""
        return self.stage != "data_process"

    @property
    def trainable(self) -> list[str]:
        """The pipeline models trained in full (``--trainable_models``)."""
        return split_csv(self.trainable_models)

    @property
    def initial_weights(self) -> str | None:
        """The weights file ``--resume_from_checkpoint`` names to start from, or None."""
        value = self.resume_from_checkpoint
        return value if value and Path(value).suffix == ".safetensors" and not Path(value).is_dir() else None

    @property
    def resume_checkpoint(self) -> str | None:
        """The training-state checkpoint (a folder, or ``latest``) ``--resume_from_checkpoint`` resumes, or None."""
        return None if self.initial_weights else self.resume_from_checkpoint

    def with_seed(self, seed: int) -> TrainingSection:
        """This section with ``--seed`` set (a run records the seed it drew, so that its config reproduces it)."""
        return dataclasses.replace(self, seed=seed)

    def problems(self) -> list[str]:
        problems = (super().problems() + self._resume_problems() + self._optimizer_problems()
                    + self._ema_problems() + self._fused_step_problems())
        if self.task not in TASKS:  # argparse refuses it already; this covers a section built in code
            problems.append(f"--task {self.task!r} is not a known task; choose one of {', '.join(TASKS)}")
        boundaries = (self.min_timestep_boundary, self.max_timestep_boundary)
        if all(map(math.isfinite, boundaries)) and not 0.0 <= boundaries[0] < boundaries[1] <= 1.0:
            problems.append(f"--min_timestep_boundary {self.min_timestep_boundary} and --max_timestep_boundary "
                            f"{self.max_timestep_boundary} must satisfy 0 <= min < max <= 1; e.g. "
                            "--min_timestep_boundary 0 --max_timestep_boundary 1")
        if self.lr_warmup_steps > 0 and self.lr_scheduler == "constant":
            problems.append(f"--lr_warmup_steps {self.lr_warmup_steps} has no effect with --lr_scheduler constant; "
                            "pass --lr_scheduler constant_with_warmup (or linear, cosine), or drop --lr_warmup_steps")
        return problems

    def _resume_problems(self) -> list[str]:
        value = self.resume_from_checkpoint
        if not value or value == "latest" or self.initial_weights or not Path(value).is_file():
            return []  # a folder that does not exist: the checkpoint resolver names it
        return [f"--resume_from_checkpoint {value} is a file but not .safetensors; weights files are read as "
                "safetensors only (pickled .bin/.pt/.ckpt files can run code when loaded): convert it, or pass a "
                "training-state folder to resume a run"]

    def _ema_problems(self) -> list[str]:
        decay = self.ema_decay
        if decay is None or not math.isfinite(decay):
            return []  # unset, or reported as not finite
        if not 0.0 < decay < 1.0:
            return [f"--ema_decay {decay} must lie strictly between 0 and 1 (the weight of the average so far at each "
                    "step); pass e.g. --ema_decay 0.999, or drop it to keep no EMA"]
        if self.task in TASKS and not self.trains:
            return [f"--ema_decay {decay} has no effect on --task {self.task}, which trains nothing; pass it to the "
                    "training stage"]
        return []

    def _fused_step_problems(self) -> list[str]:
        """What needs every gradient at once cannot run with gradients freed one by one (``loop.fused_step``)."""
        if not self.fused_optimizer_step:
            return []
        flag = "--fused_optimizer_step"
        if self.task in TASKS and not self.trains:
            return [f"{flag} has no effect on --task {self.task}, which trains nothing; pass it to the training "
                    "stage"]
        problems = []
        if self.gradient_accumulation_steps > 1:
            problems.append(f"{flag} and --gradient_accumulation_steps {self.gradient_accumulation_steps} cannot be "
                            "combined: accumulation keeps every gradient until the step's last micro-batch, which "
                            f"the fused step frees at once; drop {flag}, or pass --gradient_accumulation_steps 1")
        if self.max_grad_norm is not None:
            problems.append(f"{flag} and --max_grad_norm {self.max_grad_norm:g} cannot be combined: clipping needs "
                            f"the norm of all gradients before any weight is updated; drop one of them")
        if self.mixed_precision == "fp16":
            problems.append(f"{flag} and --mixed_precision fp16 cannot be combined: fp16's gradient scaler unscales "
                            "and checks all gradients together before stepping; use --mixed_precision bf16 (or no), "
                            f"or drop {flag}")
        return problems

    def device_problems(self) -> list[str]:
        """What this machine lacks for the run: paged optimizers page state to CUDA memory (checked for a run, not
        for the planner, which may plan for another machine)."""
        import torch

        path = self.customized_optimizer
        if self.trains and path and is_paged_optimizer(path) and not torch.cuda.is_available():
            return [f"--customized_optimizer {path} pages the optimizer state between GPU and host memory and needs "
                    f"CUDA, which this machine lacks; use --customized_optimizer {unpaged_optimizer(path)} (the same "
                    "update, not paged)"]
        return []

    def _optimizer_problems(self) -> list[str]:
        """The optimizer class must import now, not after the models loaded."""
        if not self.customized_optimizer:
            return []
        try:
            resolve_optimizer_class(self.customized_optimizer)
        except ValueError as error:
            return [str(error)]
        if self.task in TASKS and not self.trains:
            return [f"--customized_optimizer {self.customized_optimizer} has no effect on --task {self.task}, which "
                    "trains nothing; pass it to the training stage"]
        return []


def optimizer_placement_problems(training: TrainingSection, placement: PlacementConfig) -> list[str]:
    """The optimizer flags against where the weights train: a paged optimizer has nothing to page when the weights
    train in host memory, and block swap moves trained weights the fused step would update mid-backward."""
    problems = []
    path = training.customized_optimizer
    if path and is_paged_optimizer(path) and placement.enable_optimizer_cpu_offload:
        problems.append(f"--customized_optimizer {path} and --enable_optimizer_cpu_offload cannot be combined: the "
                        "weights and their optimizer state then live in host memory, where there is nothing to page; "
                        f"use --customized_optimizer {unpaged_optimizer(path)}, or drop --enable_optimizer_cpu_offload")
    if training.fused_optimizer_step and placement.blocks_to_swap:
        problems.append(f"--fused_optimizer_step and --blocks_to_swap {placement.blocks_to_swap} cannot be combined: "
                        "block swap moves the swapped blocks' weights during backward; use --enable_model_cpu_offload "
                        "(with or without --enable_optimizer_cpu_offload) instead, or drop --fused_optimizer_step")
    return problems
