"""What the training recipe (``runner.launch_training_task``) calls: the prepared run, each micro-step, each
optimizer step's bookkeeping, each epoch's end, and the end of training.

Each optimizer step ends with one all-reduce that carries the loss and three verdicts every process must share: a
non-finite loss or gradient (the step is skipped everywhere, ``nonfinite_guard``), a stop signal (every process stops
after the same step, ``preemption``), and a due timed checkpoint. With ``--fused_optimizer_step`` the weights are
updated during backward instead (``fused_step``); with ``--ema_decay`` an applied step also updates the EMA (``ema``).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ...core.data.bad_samples import pop_skipped
from ...core.finite import is_finite
from ..config.validation_prompts import ValidationConfig
from ..objective.batches import batch_sampler
from ..objective.training_module import DiffusionTrainingModule
from ..outputs.checkpoint import checkpoint_folder, save_training_state, training_flags
from ..outputs.logger import ModelLogger
from ..outputs.run_report import prompts_of
from ..placement.deepspeed import (
    deepspeed_config,
    gathered_parameters,
    initialize_deepspeed_gradient_checkpointing,
    release_unused_models,
    set_micro_batch_size,
)
from ..placement.placers import place_models, wrap_data_parallel
from .ema import EMA_SUFFIX, WeightEMA
from .fused_step import FusedOptimizerStep
from .live_report import LiveReport
from .nonfinite_guard import NonFiniteGuard, gradient_norm, step_is_finite
from .optimizer import make_optimizer
from .preemption import CheckpointClock, PreemptionListener, RunPreempted, ignore_stop_signals
from .prior_loss import PriorLoss
from .progress import ProgressReport
from .sampling import SampleRenderer
from .stage_one import signal_name
from .validation_loss import ValidationLoss

if TYPE_CHECKING:
    from ..config import RunConfig

import logging

logger = logging.getLogger(__name__)


class _Indexed(Dataset):
    """``(index, sample)`` pairs of a dataset, so that a step can name the samples it trained on."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[int, Any]:
        return index, self.dataset[index]


def step_generator(seed: int, sample_index: int) -> torch.Generator:
    """The CPU generator for one sample's timestep and noise, a function of the run's position only.

    ``sample_index`` counts samples across all processes (at batch size 1, ``micro_step * num_processes +
    process_index``, the order in which accelerate deals batches out), so P processes draw what one process
    accumulating P micro-batches would, and the two runs train the same weights.
    """
    (state,) = np.random.SeedSequence([seed, sample_index]).generate_state(1, dtype=np.uint64)
    return torch.Generator().manual_seed(int(state))


def sample_generators(seed: int, batch_number: int, batch_size: int, count: int) -> list[torch.Generator]:
    """The generators of the ``count`` samples of batch ``batch_number`` (counted over all processes, in the order
    accelerate deals batches out): sample ``j`` draws from ``step_generator(seed, batch_number * batch_size + j)``,
    its position in the run's stream of samples. So a batch of B draws what B micro-steps at batch 1 draw, and at
    batch 1 the draws are those of a run without batches (a short last batch leaves positions unused)."""
    return [step_generator(seed, batch_number * batch_size + offset) for offset in range(count)]


def _sample_names(accelerator: Any, dataset: Dataset, indices: list[int]) -> list[str]:
    """What the samples at ``indices`` on every process are (their metadata rows or cache files); a collective."""
    from accelerate.utils import gather_object

    describe = getattr(dataset, "describe_sample", lambda index: f"dataset index {index}")
    return gather_object([describe(index) for index in indices])


def _note_skipped(sample: dict[str, Any]) -> int:
    """Warns about the samples a raw dataset skipped to produce ``sample`` and returns how many."""
    bad = pop_skipped(sample)
    for one in bad:
        logger.warning("skipping sample %s (--on_bad_sample skip); the next readable row takes its place",
                       one.describe())
    return len(bad)


def _agree(accelerator: Any, loss: torch.Tensor, *flags: bool) -> tuple[float, list[bool]]:
    """The step's one all-reduce: ``loss`` averaged over the processes, and each flag, set if any process set it."""
    local = torch.cat([loss.detach().float().reshape(1).cpu(), torch.tensor([float(flag) for flag in flags])])
    total = accelerator.reduce(local.to(accelerator.device), reduction="sum").tolist()
    return total[0] / accelerator.num_processes, [value > 0 for value in total[1:]]


class TrainingLoop:
    """One training run's state between optimizer steps, and the steps of the recipe.

    Building it places the models, makes the optimizer, the batches and the schedule, lets accelerate prepare them
    and restores a checkpoint's position and optimizer state (``resume``). ``progress`` is what a checkpoint
    records: the optimizer and micro steps done, the epoch and the batch within it, the seed, the skipped
    non-finite steps, the run id and the flags that must match on resume.
    """

    def __init__(self, accelerator: Any, dataset: Dataset, module: DiffusionTrainingModule,
                 model_logger: ModelLogger, config: RunConfig, run_id: str | None,
                 resume: tuple[dict, dict, dict] | None, validation_set: Dataset | None = None) -> None:
        self.accelerator, self.dataset, self.module, self.model_logger = accelerator, dataset, module, model_logger
        self.validation_set = validation_set
        self.config, self.training, self.output = config, config.training, config.output
        self.prior = PriorLoss(dataset, config.dataset.prior_loss_weight)
        self.deepspeed = deepspeed_config(accelerator) is not None
        # The models trained in full, for --full_checkpoint_format (checked here, before placement and training).
        model_logger.attach_full_models({(host := module.pipe.host_model(name)): getattr(module.pipe, host)
                                         for name in module.trainable_models})
        self._prepare()
        self.ema = None
        if self.training.ema_decay is not None and accelerator.is_main_process:
            # Every process holds the same weights after a step: one EMA, the main process's, is enough.
            self.ema = WeightEMA({name: param for name, param in module.named_parameters() if param.requires_grad},
                                 self.training.ema_decay)
        self.progress = {"global_step": 0, "micro_step": 0, "epoch": 0, "batch_in_epoch": 0,
                         "seed": self.training.seed, "nonfinite_steps": 0, "run_id": run_id,
                         "flags": training_flags(config, module.pipe.lora_target_aliases, accelerator.num_processes)}
        if resume is not None:
            optimizer_state, scheduler_state, saved = resume
            self.optimizer.load_state_dict(optimizer_state)
            self.lr_scheduler.load_state_dict(scheduler_state)
            self.progress.update({key: saved[key] for key in ("global_step", "micro_step", "epoch", "batch_in_epoch")})
            self.progress["nonfinite_steps"] = saved.get("nonfinite_steps", 0)  # absent from older checkpoints
            if self.ema is not None and "ema" in saved:
                self.ema.load_state_dict(saved["ema"])
            elif self.ema is not None:  # a checkpoint older than the recorded flags (which compare --ema_decay)
                logger.warning("--ema_decay %g: the checkpoint holds no EMA; the EMA starts from its weights",
                               self.training.ema_decay)
        self.guard = NonFiniteGuard(self.training.max_nonfinite_steps, skipped=self.progress["nonfinite_steps"])
        # fp16's gradient scaler skips overflowing steps itself (calibration); DeepSpeed steps inside backward.
        self.check_gradients = not self.deepspeed and accelerator.scaler is None
        self.clock = CheckpointClock(self.output.checkpoint_every_minutes)
        resumed_from = checkpoint_folder(self.output.output_path, self.progress["global_step"])
        self.last_checkpoint = resumed_from if resume is not None and resumed_from.is_dir() else None
        self.last_weights = None
        self.saved_step = self.progress["global_step"]
        self.report = ProgressReport(
            self.total_steps, "training", interval_seconds=config.console.progress_interval_seconds,
            enabled=accelerator.is_local_main_process, initial=self.progress["global_step"],
            num_epochs=self.training.num_epochs, device=accelerator.device,
            # a bucket's last micro-batch may hold fewer samples: the rate is the one of full batches
            samples_per_unit=(self.training.gradient_accumulation_steps * accelerator.num_processes
                              * config.dataset.batch_size))
        self.live = LiveReport(self.output.output_path, self.total_steps, config.console.progress_interval_seconds,
                               model_logger.logged_series, enabled=accelerator.is_main_process,
                               initial_step=self.progress["global_step"], device=accelerator.device,
                               prompts=prompts_of(self.renderer.config.prompts) if self.renderer else ())
        self.losses: list[float] = []
        self.micro_losses: list[torch.Tensor] = []
        self.window: list[int] = []  # dataset indices of this process's micro-batches in the current step
        # Samples replaced because their files failed to decode (--on_bad_sample skip): this epoch's, all epochs'.
        self.skipped, self.skipped_total = 0, 0
        self.preempted = False
        self.validation_losses: list[tuple[int, float]] = []

    def _prepare(self) -> None:
        """Placement, sampler, optimizer, loader and schedule, handed to accelerate as the placement allows."""
        accelerator, module, config = self.accelerator, self.module, self.config
        if self.deepspeed:
            # DeepSpeed places and partitions the weights itself; it must not meet models this stage never runs.
            release_unused_models(module)
            self.placers = []
        else:
            self.placers = place_models(module, accelerator.device, config.placement)
        validation = ValidationConfig.from_sections(config.validation, config.dataset)
        self.renderer = None
        if validation is not None and not self.deepspeed:
            self.renderer = SampleRenderer(validation, module.pipe, module.active_model_names(), self.placers,
                                           config.placement, accelerator.device, self.output.output_path,
                                           self.model_logger, SampleRenderer.attach_meters(self.placers))
        self.validation_loss = None
        if self.validation_set is not None:
            self.validation_loss = ValidationLoss(self.validation_set, config.validation_loss.validation_loss_steps,
                                                  self.placers)
        self.params = [param for param in module.parameters() if param.requires_grad]
        optimizer = make_optimizer(self.params, self.training.learning_rate, self.training.weight_decay, accelerator,
                                   self.training.customized_optimizer)
        self.fused = (FusedOptimizerStep(optimizer, self.params, self.placers)
                      if self.training.fused_optimizer_step else None)
        batch_size = config.dataset.batch_size
        self.sampler = batch_sampler(self.dataset, batch_size, config.dataset.bucketed, self.training.seed,
                                     accelerator.num_processes, module.pipe.padded_inputs,
                                     log=accelerator.is_main_process)
        # A batch stays a list of (index, sample) pairs: the training module joins what the loss reads once every
        # sample's units have run (batches.collate_states).
        dataloader = DataLoader(_Indexed(self.dataset), batch_sampler=self.sampler, collate_fn=list,
                                num_workers=config.dataset.dataset_num_workers, worker_init_fn=ignore_stop_signals)
        if self.deepspeed:
            set_micro_batch_size(accelerator, batch_size)
            self.trained, self.optimizer, self.dataloader = accelerator.prepare(module, optimizer, dataloader)
            initialize_deepspeed_gradient_checkpointing(accelerator)
        else:
            # Weights that move cannot be wrapped by DDP: the placers average the gradients instead.
            self.trained = module if self.placers else wrap_data_parallel(accelerator, module)
            self.optimizer, self.dataloader = accelerator.prepare(optimizer, dataloader)
        steps_per_epoch = math.ceil(len(self.dataloader) / self.training.gradient_accumulation_steps)
        self.total_steps = steps_per_epoch * self.training.num_epochs
        if self.training.max_train_steps is not None:
            self.total_steps = min(self.total_steps, self.training.max_train_steps)
        from diffusers.optimization import get_scheduler

        # Stepped once per optimizer step by hand: accelerate's wrapper would step it once per process.
        self.lr_scheduler = get_scheduler(self.training.lr_scheduler, self.optimizer,
                                          num_warmup_steps=self.training.lr_warmup_steps,
                                          num_training_steps=self.total_steps)

    def epochs_left(self) -> bool:
        """Whether another epoch (or the rest of a resumed one) runs."""
        return self.progress["epoch"] < self.training.num_epochs and self.progress["global_step"] < self.total_steps

    def epoch_batches(self) -> Any:
        """This epoch's batches in its order, without those a resumed run already consumed."""
        skip = self.progress["batch_in_epoch"]
        batches = self.accelerator.skip_first_batches(self.dataloader, skip) if skip else self.dataloader
        # accelerate's loaders count epochs themselves and pass their count to the sampler; a loader made to skip
        # batches starts counting at 0, so both are told the epoch explicitly.
        batches.set_epoch(self.progress["epoch"])
        self.sampler.set_epoch(self.progress["epoch"])
        return batches

    def trainable_state(self):
        """A function returning the trainable weights (gathered from ZeRO-3 partitions)."""

        def collect() -> dict[str, torch.Tensor]:
            with gathered_parameters(self.params):
                return self.module.trainable_state_dict()

        return collect

    def micro_step(self, batch: list[tuple[int, Any]], stop_requested: bool) -> tuple[float, bool, bool, bool] | None:
        """Forward and backward of one micro-batch; on the step's last one, the checked optimizer step.

        Returns:
            None on a micro-step without an optimizer step; else ``(mean loss, whether the update was applied,
            whether a process was asked to stop, whether a timed checkpoint is due)``, agreed by every process.
        """
        accelerator, progress = self.accelerator, self.progress
        indices, samples = zip(*batch)
        self.skipped += sum(_note_skipped(sample) for sample in samples)
        outcome = None
        with accelerator.accumulate(self.trained):
            batch_number = progress["micro_step"] * accelerator.num_processes + accelerator.process_index
            generators = sample_generators(self.training.seed, batch_number, self.config.dataset.batch_size,
                                           len(samples))
            with accelerator.autocast():
                loss = self.trained(list(samples), generators=generators, sample_weights=self.prior.weights(indices))
            self.prior.record(indices, self.module.last_sample_losses)
            self.window.extend(indices)
            if self.deepspeed:  # DeepSpeed updates inside backward: the loss is checked before it
                _, (nonfinite,) = _agree(accelerator, loss, not is_finite(loss))
                if nonfinite:
                    step = progress["global_step"] + 1
                    self.guard.record(step, False, _sample_names(accelerator, self.dataset, self.window))
                    raise self.guard.diverged(step, None, self.last_weights, deepspeed=True)
            if self.fused is None:
                accelerator.backward(loss)
            else:
                # The fused step updates weights during backward: a non-finite loss must stop it before.
                self.fused.begin()
                if is_finite(loss):
                    accelerator.backward(loss)
            self.micro_losses.append(loss.detach().float())
            # Offload and block swap: unload what is left, hand host gradients to .grad and average them.
            for placer in self.placers:
                placer.after_backward(sync_gradients=accelerator.sync_gradients)
            if accelerator.sync_gradients:
                outcome = self._optimizer_step(stop_requested, self.clock.due())
        progress["micro_step"] += 1
        progress["batch_in_epoch"] += 1
        return outcome

    def _optimizer_step(self, *flags: bool) -> tuple[float, bool, bool, bool]:
        """Checks the step's losses (and gradients), agrees with the other processes, and applies the update unless
        a process saw a non-finite value; the gradients are zeroed either way."""
        max_norm, params = self.training.max_grad_norm, self.params
        norm, clipped = None, False
        if self.check_gradients and self.fused is None:
            if max_norm is not None:
                norm, clipped = self.accelerator.clip_grad_norm_(params, max_norm), True
            else:
                norm = gradient_norm(params)
        # The fused step checked each gradient before applying it, and has freed them all.
        finite = step_is_finite(self.micro_losses, norm) and (self.fused is None or self.fused.clean)
        mean_loss, (nonfinite, *agreed) = _agree(self.accelerator, torch.stack(self.micro_losses).mean(), not finite,
                                                 *flags)
        if not nonfinite and self.fused is None:
            if max_norm is not None and not clipped:
                self.accelerator.clip_grad_norm_(params, max_norm)
            self.optimizer.step()
        if not nonfinite and self.ema is not None:
            self.ema.update()
        self.optimizer.zero_grad()
        return mean_loss, not nonfinite, *agreed

    def end_step(self, mean_loss: float, applied: bool, stop: bool, checkpoint_due: bool,
                 signals: PreemptionListener | None = None) -> bool:
        """An optimizer step's bookkeeping: schedule, guard, logs, checkpoints and samples.

        ``signals`` is the run's listener: a stop signal that arrives while this step saves ends the run after the
        save (``stop_arrived``).

        Returns:
            Whether the epoch's loop ends here: the step budget is spent or the run was asked to stop.

        Raises:
            TrainingDivergedError: ``--max_nonfinite_steps`` steps in a row were non-finite.
        """
        # A skipped step advances the schedule too, on purpose, so torch's warning that the optimizer did not step
        # first is silenced.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
            self.lr_scheduler.step()
        self.progress["global_step"] += 1
        step = self.progress["global_step"]
        samples = [] if applied else _sample_names(self.accelerator, self.dataset, self.window)
        diverged = self.guard.record(step, applied, samples)
        self.progress["nonfinite_steps"] = self.guard.skipped
        self.window.clear()
        self.micro_losses.clear()
        self.losses.append(mean_loss)
        self.report.update(mean_loss, self.progress["epoch"])
        lr = self.lr_scheduler.get_last_lr()[0]
        metrics = {"nonfinite_steps": self.guard.skipped}
        if self.prior.active:  # a column from the first row, empty on a step without regularization samples
            metrics["loss_prior"] = self.prior.step_value(self.accelerator)
        if self.validation_loss is not None:  # a column from the first row, empty where not measured
            metrics["val_loss"] = self._measure_validation_loss(step, stop)
        written = self.model_logger.on_step_end(step, mean_loss, lr, self.trainable_state(), metrics)
        self._save_ema(written)
        self.last_weights = written or self.last_weights
        if diverged:
            raise self.guard.diverged(step, self.last_checkpoint, self.last_weights)
        save_steps = self.output.save_steps
        saved = written is not None
        if (save_steps and step % save_steps == 0) or checkpoint_due:
            self.checkpoint()
            saved = True
            stop = stop or (step < self.total_steps and self.stop_arrived(signals))
        if self.renderer is not None and not stop and self.renderer.due(step):
            self.renderer.render(step, self.accelerator)
            saved = True
        # The page: after the first step, each interval, each save and render, and each validation loss measured.
        self.live.update(step, force=saved or metrics.get("val_loss") is not None)
        self.preempted = stop and step < self.total_steps
        return step >= self.total_steps or stop

    def _measure_validation_loss(self, step: int, stop: bool) -> float | None:
        """The validation loss after ``step`` when it is due (not on a step a stop signal ends early), else None."""
        if self.validation_loss is None or not self.validation_loss.due(step, self.total_steps):
            return None
        if stop and step < self.total_steps:
            return None  # a scheduler's grace period is for the checkpoint
        value = self.validation_loss.measure(self.accelerator, self.trained, self.module)
        if self.accelerator.is_main_process:
            logger.info("validation loss at step %d: %.6g", step, value)
        self.validation_losses.append((step, value))
        return value

    def end_epoch(self, signals: PreemptionListener | None = None) -> None:
        """Counts the epoch's skipped samples; an epoch run to its end writes its weights file and a checkpoint,
        renders the samples due and moves the data position to the next epoch. A stop signal that arrives while it
        saves (``signals``, ``stop_arrived``) sets ``preempted``."""
        accelerator, progress = self.accelerator, self.progress
        total = int(accelerator.reduce(torch.tensor(self.skipped, device=accelerator.device), reduction="sum").item())
        if total and accelerator.is_main_process:
            logger.warning("epoch %d: %d sample(s) skipped because their files failed to decode", progress["epoch"],
                           total)
        self.skipped_total += total
        self.skipped = 0
        if progress["batch_in_epoch"] < len(self.dataloader):
            return
        written = self.model_logger.on_epoch_end(progress["epoch"], self.trainable_state())
        self._save_ema(written)
        self.last_weights = written or self.last_weights
        progress["epoch"] += 1
        progress["batch_in_epoch"] = 0
        self.checkpoint()
        self.preempted = self.preempted or (progress["global_step"] < self.total_steps and self.stop_arrived(signals))
        if self.renderer is not None and not self.preempted and self.renderer.due(progress["global_step"],
                                                                                  progress["epoch"]):
            self.renderer.render(progress["global_step"], self.accelerator)
        self.live.update(progress["global_step"], force=True)

    def stop_arrived(self, signals: PreemptionListener | None) -> bool:
        """Whether a stop signal has reached any process, asked right after a save: a signal that arrived during the
        save then ends the run there, rather than after one more step and a second save, which a scheduler's grace
        period may not leave time for. Every process saves at the same points, so all of them take part in this
        all-reduce."""
        if signals is None:
            return False
        requested = torch.tensor([float(signals.requested)], device=self.accelerator.device)
        return bool(self.accelerator.reduce(requested, reduction="sum").item() > 0)

    def checkpoint(self) -> None:
        """Writes a training-state checkpoint of the current step (none under DeepSpeed, whose optimizer states are
        partitioned; resuming under it is refused at start-up) and restarts the checkpoint clock."""
        self.saved_step = self.progress["global_step"]
        self.clock.reset()
        if self.deepspeed:
            return
        if self.accelerator.is_main_process:
            save_training_state(self.output.output_path, self.trainable_state()(), self.optimizer.state_dict(),
                                self.lr_scheduler.state_dict(), self.progress,
                                keep_last=self.output.checkpoints_total_limit,
                                ema=self.ema.state_dict() if self.ema is not None else None)
        self.accelerator.wait_for_everyone()
        self.last_checkpoint = checkpoint_folder(self.output.output_path, self.saved_step)

    def _save_ema(self, written: Path | None) -> None:
        """Writes the EMA twin ``<name>-ema`` of the weights file just written (main process; none without EMA)."""
        if self.ema is None or written is None:
            return
        # The save point's name, not the file's: with --full_checkpoint_format original alone the file written is
        # <name>.dit.original.safetensors.
        self.model_logger.save_checkpoint(self.ema.state_dict(), f"{self.model_logger.last_saved_name}{EMA_SUFFIX}",
                                          {"ema_decay": self.ema.decay})

    def finish(self, preemption: PreemptionListener) -> dict[str, Any]:
        """Ends training: a run cut short (``--max_train_steps``, a signal) is checkpointed first, as that is what a
        resume needs when a scheduler's grace period runs out, then the weights file; the placements are undone.

        Raises:
            RunPreempted: The run was asked to stop; the message says how to continue.
        """
        self.report.close()
        if self.saved_step != self.progress["global_step"]:
            self.checkpoint()
        self._save_ema(self.model_logger.on_train_end(self.progress["global_step"], self.trainable_state()))
        if self.fused is not None:
            self.fused.remove()
        for placer in self.placers:
            placer.remove()
        step = self.progress["global_step"]
        if self.preempted:
            output = self.output.output_path
            kept = (f"the weights are in {output}; continue from them with --lora_checkpoint (DeepSpeed writes no "
                    "training-state checkpoint)" if self.deepspeed else f"checkpoint {self.last_checkpoint} written; "
                    "rerun the same command with --resume_from_checkpoint latest to continue")
            raise RunPreempted(f"training stopped by {signal_name(preemption)} after optimizer step {step}: {kept}",
                               step)
        return {"global_step": step, "losses": self.losses, "nonfinite_steps": self.guard.skipped,
                "skipped_samples": self.skipped_total,
                "sample_peaks": self.renderer.peaks if self.renderer is not None else {},
                "val_losses": self.validation_losses}
