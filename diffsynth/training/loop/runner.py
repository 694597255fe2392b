"""Runs one task stage under accelerate: stage-1 caching (``launch_data_process_task``) and training
(``launch_training_task``).

Model placement differs from a plain accelerate script in one way: with ``--enable_model_cpu_offload`` the models
stay in host memory under one ``OffloadTrainingManager`` each, and with ``--blocks_to_swap`` the denoiser's blocks
move between host and device. Weights that move cannot be wrapped by DDP, so then the training module is neither
moved nor prepared (only the optimizer and the dataloader are), and the trainable gradients are averaged across
processes without DDP: by each manager's ``after_backward()``, or by a ``GradientSynchronizer`` under block swap.
Without either, only the models the stage computes with move to the device.

Each optimizer step ends with one all-reduce that carries the loss and three verdicts every process must share: a
non-finite loss or gradient (the step is skipped everywhere, ``nonfinite_guard``), a stop signal (every process stops
after the same step, ``preemption``), and a due timed checkpoint.
"""

from __future__ import annotations

import argparse
import logging
import math
import signal
import warnings
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from ...core.data import UnifiedDataset
from ...core.data.bad_samples import pop_skipped
from ...core.data.cache import cache_file_path, save_cache_sample, write_cache_info, write_cache_manifest
from ...core.data.cache_sync import summarise, sync_stage_one_cache
from ...core.data.fingerprint import digest
from ...core.finite import is_finite
from ...core.offload_training import BlockSwap, OffloadTrainingManager, create_offloader
from ...core.offload_training.grad_sync import GradientSynchronizer
from ..objective.batches import batch_sampler, bucketed
from ..objective.training_module import DiffusionTrainingModule
from ..outputs.checkpoint import checkpoint_folder, save_training_state, training_flags
from ..outputs.logger import ModelLogger
from ..placement.config import PlacementConfig
from ..placement.deepspeed import (
    deepspeed_config,
    gathered_parameters,
    initialize_deepspeed_gradient_checkpointing,
    release_unused_models,
    set_micro_batch_size,
)
from .nonfinite_guard import NonFiniteGuard, gradient_norm, step_is_finite
from .optimizer import make_optimizer
from .preemption import CheckpointClock, PreemptionListener, RunPreempted, ignore_stop_signals
from .progress import ProgressReport
from .sampling import SampleRenderer
from .validation_prompts import ValidationConfig

logger = logging.getLogger(__name__)


def _first(batch: list[Any]) -> Any:
    """One sample per step of stage 1, which runs each sample's units alone."""
    return batch[0]


class _Indexed(Dataset):
    """``(index, sample)`` pairs of a dataset, so that a step can name the samples it trained on."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[int, Any]:
        return index, self.dataset[index]


def _sample_names(accelerator: Any, dataset: Dataset, indices: list[int]) -> list[str]:
    """What the samples at ``indices`` on every process are (their metadata rows or cache files); a collective."""
    from accelerate.utils import gather_object

    describe = getattr(dataset, "describe_sample", lambda index: f"dataset index {index}")
    return gather_object([describe(index) for index in indices])


def _signal_name(preemption: PreemptionListener) -> str:
    if preemption.received is None:
        return "a stop signal another process received"
    return signal.Signals(preemption.received).name


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


def place_models(module: DiffusionTrainingModule, device: torch.device, placement: PlacementConfig
                 ) -> tuple[list[OffloadTrainingManager], list[BlockSwap]]:
    """Puts the stage's models where they compute: on the device, under offload managers, or under block swap.

    One manager per model rather than one over the pipeline: the pipeline object itself is never called, and each
    manager needs its model's own forward to bracket the saved-tensor hooks. Block swap (``--blocks_to_swap``)
    applies to the denoising model only; the other models go to the device whole.

    Returns:
        ``(managers, block_swaps)``: what the loop must call ``after_backward()`` on, and what to ``remove()``.
    """
    pipe = module.pipe
    pipe.manage_model_devices = False
    names = module.active_model_names()
    if not placement.enable_model_cpu_offload:
        swaps = []
        for name in names:
            model = getattr(pipe, name)
            if placement.blocks_to_swap and name in pipe.denoising_model_names:
                swaps.append(create_offloader(model, placement.block_swap, device))
            else:
                model.to(device)
        return [], swaps
    managers = []
    for name in names:
        model = getattr(pipe, name)
        trains = any(param.requires_grad for param in model.parameters())
        managers.append(OffloadTrainingManager(model, device, **placement.offload_options(trains)))
    return managers, []


def launch_data_process_task(accelerator: Any, dataset: UnifiedDataset, module: DiffusionTrainingModule,
                             args: argparse.Namespace, placement: PlacementConfig, command: str | None = None) -> int:
    """Stage 1: runs the stage's units on every sample and writes one cache file per sample.

    Processes take every ``num_processes``-th sample. A rerun keeps each file whose fingerprint still matches its
    sample, recomputes the others and removes the files of samples that are gone (``cache_sync``); it reports what it
    did on the main process. Samples whose files fail to decode are skipped or stop the run (``--on_bad_sample``).

    Args:
        accelerator: The run's ``accelerate.Accelerator``.
        dataset: The metadata dataset, built with ``keep_row_indices`` (sample ``i`` is row ``i``).
        module: The stage-1 training module.
        args: The parsed flags.
        command: The command line that reruns this stage, recorded for stage 2's message about a partial cache.

    Returns:
        The number of samples this process computed (not counting those it kept or skipped).

    Raises:
        RunPreempted: SIGTERM / SIGINT arrived; this process stopped after the sample in progress.
    """
    from accelerate.utils import gather_object

    info = module.cache_info()
    models = digest(module.stage_one_identity())  # before placing: offload leaves no weights to read
    place_models(module, accelerator.device, placement)  # stage 1 never runs the denoiser, so nothing is swapped
    if accelerator.is_main_process:
        write_cache_info(args.output_path, info)
    accelerator.wait_for_everyone()
    num_samples = len(dataset.rows)
    sync = sync_stage_one_cache(args.output_path, accelerator.process_index, accelerator.num_processes, num_samples,
                                lambda index, stored: dataset.fingerprint(index, models, stored),
                                skipped=dataset.excluded)
    accelerator.wait_for_everyone()
    skipped = {index: bad.describe() for index, bad in dataset.excluded.items()}
    if accelerator.is_main_process:
        # Written once every stale file is gone: from here on the folder holds only samples of this dataset.
        write_cache_manifest(args.output_path, num_samples, skipped, command)
    loader = DataLoader(Subset(dataset, sync.todo), batch_size=1, collate_fn=_first,
                        num_workers=args.dataset_num_workers, worker_init_fn=ignore_stop_signals)
    report = ProgressReport(len(sync.todo), "caching", interval_seconds=args.progress_interval_seconds,
                            enabled=accelerator.is_local_main_process, unit="sample", device=accelerator.device)
    skipped_here = []
    with PreemptionListener() as preemption:
        for done, (index, sample) in enumerate(zip(sync.todo, loader), start=1):
            bad = pop_skipped(sample)
            if bad:
                logger.warning("skipping sample %s (--on_bad_sample skip); it is not cached", bad[0].describe())
                skipped_here.extend(bad)
            else:
                state = module.process_sample(sample)
                save_cache_sample(cache_file_path(args.output_path, accelerator.process_index, index), state, info,
                                  sync.fingerprints[index])
            report.update()
            if preemption.requested and done < len(sync.todo):
                raise RunPreempted(f"stage 1 stopped by {_signal_name(preemption)} after {done} of the "
                                   f"{len(sync.todo)} samples process {accelerator.process_index} had to compute; "
                                   f"rerun the same command to compute the other {len(sync.todo) - done}", done)
    report.close()
    accelerator.wait_for_everyone()
    counts = gather_object([sync.counts()])
    late = gather_object([(bad.index, bad.describe()) for bad in skipped_here])
    if accelerator.is_main_process:
        skipped.update(late)
        if late:
            write_cache_manifest(args.output_path, num_samples, skipped, command)
        print(f"stage 1: {summarise(counts, skipped=len(skipped))}. Cache in {args.output_path}; train from it with "
              f"--task {args.task.split(':')[0]}:train --dataset_base_path {args.output_path}")
    return len(sync.todo) - len(skipped_here)


def _note_skipped(sample: dict[str, Any]) -> int:
    """Warns about the samples a raw dataset skipped to produce ``sample`` and returns how many."""
    bad = pop_skipped(sample)
    for one in bad:
        logger.warning("skipping sample %s (--on_bad_sample skip); the next readable row takes its place",
                       one.describe())
    return len(bad)


def _report_skipped(accelerator: Any, skipped: int, epoch: int) -> int:
    """Logs and returns this epoch's skipped samples, added up over the processes (every process must call it)."""
    total = int(accelerator.reduce(torch.tensor(skipped, device=accelerator.device), reduction="sum").item())
    if total and accelerator.is_main_process:
        logger.warning("epoch %d: %d sample(s) skipped because their files failed to decode", epoch, total)
    return total


def _trainable_state(accelerator: Any, module: DiffusionTrainingModule):
    params = [param for param in module.parameters() if param.requires_grad]

    def collect() -> dict[str, torch.Tensor]:
        with gathered_parameters(params):
            return module.trainable_state_dict()

    return collect


def _agree(accelerator: Any, loss: torch.Tensor, *flags: bool) -> tuple[float, list[bool]]:
    """The step's one all-reduce: ``loss`` averaged over the processes, and each flag, set if any process set it."""
    local = torch.cat([loss.detach().float().reshape(1).cpu(), torch.tensor([float(flag) for flag in flags])])
    total = accelerator.reduce(local.to(accelerator.device), reduction="sum").tolist()
    return total[0] / accelerator.num_processes, [value > 0 for value in total[1:]]


def _optimizer_step(accelerator: Any, optimizer: Any, params: list[torch.nn.Parameter],
                    micro_losses: list[torch.Tensor], args: argparse.Namespace, check_gradients: bool,
                    *flags: bool) -> tuple[float, bool, list[bool]]:
    """Checks the step's losses (and gradients), agrees with the other processes, and applies the update unless a
    process saw a non-finite value; the gradients are zeroed either way.

    Returns:
        ``(mean loss over micro-batches and processes, whether the update was applied, flags as agreed)``.
    """
    norm, clipped = None, False
    if check_gradients:
        if args.max_grad_norm is not None:
            norm, clipped = accelerator.clip_grad_norm_(params, args.max_grad_norm), True
        else:
            norm = gradient_norm(params)
    finite = step_is_finite(micro_losses, norm)
    mean_loss, (nonfinite, *agreed) = _agree(accelerator, torch.stack(micro_losses).mean(), not finite, *flags)
    if not nonfinite:
        if args.max_grad_norm is not None and not clipped:
            accelerator.clip_grad_norm_(params, args.max_grad_norm)
        optimizer.step()
    optimizer.zero_grad()
    return mean_loss, not nonfinite, agreed


def launch_training_task(accelerator: Any, dataset: Dataset, module: DiffusionTrainingModule,
                         model_logger: ModelLogger, args: argparse.Namespace, placement: PlacementConfig,
                         resume: tuple[dict, dict, dict] | None = None) -> dict[str, Any]:
    """Trains ``module`` on ``dataset`` for ``--num_epochs`` (or ``--max_train_steps``) optimizer steps.

    Args:
        accelerator: The run's ``accelerate.Accelerator``.
        dataset: Raw samples (one-stage) or the stage-1 cache (``sft:train``).
        module: The training module; trainable weights already restored when resuming.
        model_logger: Writes LoRA files, metrics and the flags.
        args: The parsed flags; ``args.seed`` must be set.
        placement: Where the weights live (offload, block swap), made once from the flags.
        resume: ``(optimizer_state, scheduler_state, progress)`` from a checkpoint, or None.

    Returns:
        ``{"global_step", "losses", "nonfinite_steps", "skipped_samples", "sample_peaks"}``: the optimizer steps
        done, the mean loss of each (over its micro-batches and the processes; NaN or inf for a skipped step), how
        many steps were skipped as non-finite (over the whole run, resumed parts included), the samples replaced
        because their files failed to decode, and for each step samples were rendered at, the peak bytes of
        offloaded weights on the device while rendering and while training (``SampleRenderer.peaks``).

    Raises:
        TrainingDivergedError: ``--max_nonfinite_steps`` steps in a row were non-finite (under DeepSpeed: one).
        RunPreempted: SIGTERM / SIGINT arrived; the step in progress finished, then a checkpoint and the weights file
            of that step were written.
    """
    from diffusers.optimization import get_scheduler

    deepspeed = deepspeed_config(accelerator) is not None
    if deepspeed:
        # DeepSpeed places and partitions the weights itself; it must not meet models this stage never runs.
        release_unused_models(module)
        managers, swaps = [], []
    else:
        managers, swaps = place_models(module, accelerator.device, placement)
    validation = ValidationConfig.from_args(args) if getattr(args, "validation_prompts", None) else None
    renderer = None
    if validation is not None and not deepspeed:
        renderer = SampleRenderer(validation, module.pipe, module.active_model_names(), managers, placement,
                                  accelerator.device, args.output_path, model_logger,
                                  SampleRenderer.attach_meters(managers, swaps))
    params = [param for param in module.parameters() if param.requires_grad]
    optimizer = make_optimizer(params, args.learning_rate, args.weight_decay, accelerator, args.customized_optimizer)
    sampler = batch_sampler(dataset, args.batch_size, bucketed(args), args.seed, accelerator.num_processes,
                            module.pipe.padded_inputs, log=accelerator.is_main_process)
    # A batch stays a list of (index, sample) pairs: the training module joins what the loss reads once every
    # sample's units have run (batches.collate_states).
    dataloader = DataLoader(_Indexed(dataset), batch_sampler=sampler, collate_fn=list,
                            num_workers=args.dataset_num_workers, worker_init_fn=ignore_stop_signals)
    if deepspeed:
        set_micro_batch_size(accelerator, args.batch_size)
        trained, optimizer, dataloader = accelerator.prepare(module, optimizer, dataloader)
        initialize_deepspeed_gradient_checkpointing(accelerator)
    elif managers or swaps:
        trained = module
        optimizer, dataloader = accelerator.prepare(optimizer, dataloader)
    else:
        trained = accelerator.prepare_model(module, device_placement=False)
        optimizer, dataloader = accelerator.prepare(optimizer, dataloader)
    # Block swap's model is not wrapped by DDP (its weights move), so its gradients are averaged here.
    swap_grad_sync = GradientSynchronizer(params) if swaps and accelerator.num_processes > 1 else None
    steps_per_epoch = math.ceil(len(dataloader) / args.gradient_accumulation_steps)
    total_steps = steps_per_epoch * args.num_epochs
    if args.max_train_steps is not None:
        total_steps = min(total_steps, args.max_train_steps)
    # Stepped once per optimizer step by hand: accelerate's wrapper would step it once per process.
    lr_scheduler = get_scheduler(args.lr_scheduler, optimizer, num_warmup_steps=args.lr_warmup_steps,
                                 num_training_steps=total_steps)
    # The run id lets pruning tell this run's checkpoints from others'; the flags let a resume check its own.
    progress = {"global_step": 0, "micro_step": 0, "epoch": 0, "batch_in_epoch": 0, "seed": args.seed,
                "nonfinite_steps": 0, "run_id": getattr(args, "run_id", None),
                "flags": training_flags(args, module.pipe.lora_target_aliases)}
    if resume is not None:
        optimizer_state, scheduler_state, saved = resume
        optimizer.load_state_dict(optimizer_state)
        lr_scheduler.load_state_dict(scheduler_state)
        progress.update({key: saved[key] for key in ("global_step", "micro_step", "epoch", "batch_in_epoch")})
        progress["nonfinite_steps"] = saved.get("nonfinite_steps", 0)  # absent from checkpoints of older versions
    guard = NonFiniteGuard(args.max_nonfinite_steps, skipped=progress["nonfinite_steps"])
    # fp16's gradient scaler skips overflowing steps itself (calibration); DeepSpeed steps inside backward.
    check_gradients = not deepspeed and accelerator.scaler is None
    clock = CheckpointClock(args.checkpoint_every_minutes)
    resumed_from = checkpoint_folder(args.output_path, progress["global_step"])
    last_checkpoint = resumed_from if resume is not None and resumed_from.is_dir() else None
    last_weights = None

    saved_step = progress["global_step"]

    def checkpoint() -> None:
        nonlocal saved_step, last_checkpoint
        saved_step = progress["global_step"]
        clock.reset()
        if deepspeed:
            return  # ZeRO partitions the optimizer states; resuming under DeepSpeed is refused at start-up
        if accelerator.is_main_process:
            save_training_state(args.output_path, _trainable_state(accelerator, module)(), optimizer.state_dict(),
                                lr_scheduler.state_dict(), progress, keep_last=args.checkpoints_total_limit)
        accelerator.wait_for_everyone()
        last_checkpoint = checkpoint_folder(args.output_path, saved_step)

    report = ProgressReport(total_steps, "training", interval_seconds=args.progress_interval_seconds,
                            enabled=accelerator.is_local_main_process, initial=progress["global_step"],
                            num_epochs=args.num_epochs, device=accelerator.device,
                            samples_per_unit=args.gradient_accumulation_steps * accelerator.num_processes)
    losses: list[float] = []
    micro_losses: list[torch.Tensor] = []
    window: list[int] = []  # dataset indices of this process's micro-batches in the current step
    # Samples replaced because their files failed to decode (--on_bad_sample skip): this epoch's here, all processes'.
    skipped, skipped_total = 0, 0
    preempted = False
    with PreemptionListener() as preemption:
        while progress["epoch"] < args.num_epochs and progress["global_step"] < total_steps:
            # Data: this epoch's order, skipping the batches a resumed run already consumed.
            skip = progress["batch_in_epoch"]
            batches = accelerator.skip_first_batches(dataloader, skip) if skip else dataloader
            # accelerate's loaders count epochs themselves and pass their count to the sampler; a loader made to skip
            # batches starts counting at 0, so both are told the epoch explicitly.
            batches.set_epoch(progress["epoch"])
            sampler.set_epoch(progress["epoch"])
            for batch in batches:
                indices, samples = zip(*batch)
                skipped += sum(_note_skipped(sample) for sample in samples)
                # Forward and backward, accumulating over micro-batches; then the checked optimizer step.
                with accelerator.accumulate(trained):
                    batch_number = progress["micro_step"] * accelerator.num_processes + accelerator.process_index
                    generators = sample_generators(args.seed, batch_number, args.batch_size, len(samples))
                    with accelerator.autocast():
                        loss = trained(list(samples), generators=generators)
                    window.extend(indices)
                    if deepspeed:  # DeepSpeed updates inside backward: the loss is checked before it
                        _, (nonfinite,) = _agree(accelerator, loss, not is_finite(loss))
                        if nonfinite:
                            step = progress["global_step"] + 1
                            guard.record(step, False, _sample_names(accelerator, dataset, window))
                            raise guard.diverged(step, None, last_weights, deepspeed=True)
                    accelerator.backward(loss)
                    micro_losses.append(loss.detach().float())
                    # Offload: unload what is left, hand host gradients to .grad and average them before the step.
                    for manager in managers:
                        manager.after_backward(sync_gradients=accelerator.sync_gradients)
                    if swap_grad_sync is not None and accelerator.sync_gradients:
                        swap_grad_sync.all_reduce_mean()
                    if accelerator.sync_gradients:
                        mean_loss, applied, (stop, checkpoint_due) = _optimizer_step(
                            accelerator, optimizer, params, micro_losses, args, check_gradients,
                            preemption.requested, clock.due())
                progress["micro_step"] += 1
                progress["batch_in_epoch"] += 1
                if not accelerator.sync_gradients:
                    continue
                # Bookkeeping: schedule, guard, logs and checkpoints. A skipped step advances the schedule too, on
                # purpose, so torch's warning that the optimizer did not step first is silenced.
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
                    lr_scheduler.step()
                progress["global_step"] += 1
                step = progress["global_step"]
                diverged = guard.record(step, applied, [] if applied else _sample_names(accelerator, dataset, window))
                progress["nonfinite_steps"] = guard.skipped
                window.clear()
                micro_losses.clear()
                losses.append(mean_loss)
                report.update(mean_loss, progress["epoch"])
                lr = lr_scheduler.get_last_lr()[0]
                last_weights = model_logger.on_step_end(step, mean_loss, lr, _trainable_state(accelerator, module),
                                                        {"nonfinite_steps": guard.skipped}) or last_weights
                if diverged:
                    raise guard.diverged(step, last_checkpoint, last_weights)
                if (args.save_steps and step % args.save_steps == 0) or checkpoint_due:
                    checkpoint()
                if renderer is not None and not stop and renderer.due(step):
                    renderer.render(step, accelerator)
                if step >= total_steps:
                    break
                if stop:
                    preempted = True
                    break
            skipped_total += _report_skipped(accelerator, skipped, progress["epoch"])
            skipped = 0
            if progress["batch_in_epoch"] >= len(dataloader):
                # The epoch ran to its end: save it and move the data position to the next one.
                last_weights = model_logger.on_epoch_end(progress["epoch"],
                                                         _trainable_state(accelerator, module)) or last_weights
                progress["epoch"] += 1
                progress["batch_in_epoch"] = 0
                checkpoint()
                if renderer is not None and not preempted and renderer.due(progress["global_step"], progress["epoch"]):
                    renderer.render(progress["global_step"], accelerator)
            if preempted:
                break
    report.close()
    # A run cut short (--max_train_steps, a signal) can be continued from here: the training state first, as it is
    # what a resume needs when a scheduler's grace period runs out, then the weights file.
    if saved_step != progress["global_step"]:
        checkpoint()
    model_logger.on_train_end(progress["global_step"], _trainable_state(accelerator, module))
    for placer in [*managers, *swaps]:
        placer.remove()
    if preempted:
        kept = (f"the weights are in {args.output_path}; continue from them with --lora_checkpoint (DeepSpeed writes "
                "no training-state checkpoint)" if deepspeed else f"checkpoint {last_checkpoint} written; rerun the "
                "same command with --resume_from_checkpoint latest to continue")
        raise RunPreempted(f"training stopped by {_signal_name(preemption)} after optimizer step "
                           f"{progress['global_step']}: {kept}", progress["global_step"])
    return {"global_step": progress["global_step"], "losses": losses, "nonfinite_steps": guard.skipped,
            "skipped_samples": skipped_total, "sample_peaks": renderer.peaks if renderer is not None else {}}
