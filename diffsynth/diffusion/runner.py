"""Runs one task stage under accelerate: stage-1 caching (``launch_data_process_task``) and training
(``launch_training_task``).

Model placement differs from a plain accelerate script in one way: with ``--enable_model_cpu_offload`` the models
stay in host memory under one ``OffloadTrainingManager`` each, and with ``--blocks_to_swap`` the denoiser's blocks
move between host and device. Weights that move cannot be wrapped by DDP, so then the training module is neither
moved nor prepared (only the optimizer and the dataloader are), and the trainable gradients are averaged across
processes without DDP: by each manager's ``after_backward()``, or by a ``GradientSynchronizer`` under block swap.
Without either, only the models the stage computes with move to the device.
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, Subset
from tqdm.auto import tqdm

from ..core.data.cache import cache_file_path, is_cached, save_cache_sample, write_cache_info
from ..core.offload_training import BlockSwap, OffloadTrainingManager, create_offloader
from ..core.offload_training.grad_sync import GradientSynchronizer
from .checkpoint import save_training_state
from .deepspeed_support import (deepspeed_config, gathered_parameters, initialize_deepspeed_gradient_checkpointing,
                                make_optimizer, release_unused_models)
from .logger import ModelLogger
from .placement_config import PlacementConfig
from .training_module import DiffusionTrainingModule

logger = logging.getLogger(__name__)


def _first(batch: list[Any]) -> Any:
    """One sample per step: samples differ in size, so they are not stacked."""
    return batch[0]


class EpochShuffleSampler(Sampler[int]):
    """A permutation of the dataset per epoch, drawn from ``(seed, epoch)`` alone.

    Every process draws the same order (accelerate then deals the batches out), and a resumed run redraws the order
    of the epoch it stopped in without any saved generator state.
    """

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        yield from torch.randperm(self.size, generator=generator).tolist()

    def __len__(self) -> int:
        return self.size


def step_generator(seed: int, sample_index: int) -> torch.Generator:
    """The CPU generator for one sample's timestep and noise, a function of the run's position only.

    ``sample_index`` counts samples across all processes (``micro_step * num_processes + process_index``, the order
    in which accelerate deals batches out), so P processes draw what one process accumulating P micro-batches
    would, and the two runs train the same weights.
    """
    (state,) = np.random.SeedSequence([seed, sample_index]).generate_state(1, dtype=np.uint64)
    return torch.Generator().manual_seed(int(state))


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


def launch_data_process_task(accelerator: Any, dataset: Dataset, module: DiffusionTrainingModule,
                             args: argparse.Namespace, placement: PlacementConfig) -> int:
    """Stage 1: runs the stage's units on every sample and writes one cache file per sample.

    Processes take every ``num_processes``-th sample. Files already complete are skipped, so rerunning an
    interrupted stage 1 resumes it.

    Returns:
        The number of samples this process computed (not counting those it skipped).
    """
    place_models(module, accelerator.device, placement)  # stage 1 never runs the denoiser, so nothing is swapped
    info = module.cache_info()
    if accelerator.is_main_process:
        write_cache_info(args.output_path, info)
    accelerator.wait_for_everyone()
    mine = range(accelerator.process_index, len(dataset), accelerator.num_processes)
    todo = [index for index in mine if not is_cached(cache_file_path(args.output_path, accelerator.process_index,
                                                                     index))]
    if len(todo) < len(mine):
        logger.info("process %d: %d of %d samples already cached; computing the other %d",
                    accelerator.process_index, len(mine) - len(todo), len(mine), len(todo))
    loader = DataLoader(Subset(dataset, todo), batch_size=1, collate_fn=_first, num_workers=args.dataset_num_workers)
    bar = tqdm(zip(todo, loader), total=len(todo), desc="caching", disable=not accelerator.is_local_main_process)
    for index, sample in bar:
        state = module.process_sample(sample)
        save_cache_sample(cache_file_path(args.output_path, accelerator.process_index, index), state, info)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print(f"stage-1 cache written to {args.output_path}; train from it with --task "
              f"{args.task.split(':')[0]}:train --dataset_base_path {args.output_path}")
    return len(todo)


def _trainable_state(accelerator: Any, module: DiffusionTrainingModule):
    params = [param for param in module.parameters() if param.requires_grad]

    def collect() -> dict[str, torch.Tensor]:
        with gathered_parameters(params):
            return module.trainable_state_dict()

    return collect


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
        ``{"global_step", "losses"}``: the optimizer steps done and the mean loss of each (over its micro-batches
        and the processes).
    """
    from diffusers.optimization import get_scheduler

    deepspeed = deepspeed_config(accelerator) is not None
    if deepspeed:
        # DeepSpeed places and partitions the weights itself; it must not meet models this stage never runs.
        release_unused_models(module)
        managers, swaps = [], []
    else:
        managers, swaps = place_models(module, accelerator.device, placement)
    params = [param for param in module.parameters() if param.requires_grad]
    optimizer = make_optimizer(params, args.learning_rate, args.weight_decay, accelerator)
    sampler = EpochShuffleSampler(len(dataset), args.seed)
    dataloader = DataLoader(dataset, batch_size=1, sampler=sampler, collate_fn=_first,
                            num_workers=args.dataset_num_workers)
    if deepspeed:
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
    progress = {"global_step": 0, "micro_step": 0, "epoch": 0, "batch_in_epoch": 0, "seed": args.seed}
    if resume is not None:
        optimizer_state, scheduler_state, saved = resume
        optimizer.load_state_dict(optimizer_state)
        lr_scheduler.load_state_dict(scheduler_state)
        progress.update({key: saved[key] for key in ("global_step", "micro_step", "epoch", "batch_in_epoch")})

    saved_step = progress["global_step"]

    def checkpoint() -> None:
        nonlocal saved_step
        saved_step = progress["global_step"]
        if deepspeed:
            return  # ZeRO partitions the optimizer states; resuming under DeepSpeed is refused at start-up
        if accelerator.is_main_process:
            save_training_state(args.output_path, _trainable_state(accelerator, module)(), optimizer.state_dict(),
                                lr_scheduler.state_dict(), progress, keep_last=args.checkpoints_total_limit)
        accelerator.wait_for_everyone()

    bar = tqdm(total=total_steps, initial=progress["global_step"], desc="training",
               disable=not accelerator.is_local_main_process)
    losses: list[float] = []
    micro_losses: list[torch.Tensor] = []
    step_started = time.perf_counter()
    while progress["epoch"] < args.num_epochs and progress["global_step"] < total_steps:
        # Data: this epoch's order, skipping the batches a resumed run already consumed.
        skip = progress["batch_in_epoch"]
        batches = accelerator.skip_first_batches(dataloader, skip) if skip else dataloader
        # accelerate's loaders count epochs themselves and pass their count to the sampler; a loader made to skip
        # batches starts counting at 0, so both are told the epoch explicitly.
        batches.set_epoch(progress["epoch"])
        sampler.set_epoch(progress["epoch"])
        for sample in batches:
            # Forward and backward, accumulating over micro-batches.
            with accelerator.accumulate(trained):
                sample_index = progress["micro_step"] * accelerator.num_processes + accelerator.process_index
                generator = step_generator(args.seed, sample_index)
                with accelerator.autocast():
                    loss = trained(sample, generator=generator)
                accelerator.backward(loss)
                micro_losses.append(loss.detach().float())
                # Offload: unload what is left, hand host gradients to .grad and average them before the step.
                for manager in managers:
                    manager.after_backward(sync_gradients=accelerator.sync_gradients)
                if swap_grad_sync is not None and accelerator.sync_gradients:
                    swap_grad_sync.all_reduce_mean()
                if accelerator.sync_gradients and args.max_grad_norm is not None:
                    accelerator.clip_grad_norm_(params, args.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad()
            progress["micro_step"] += 1
            progress["batch_in_epoch"] += 1
            if not accelerator.sync_gradients:
                continue
            # Bookkeeping: schedule, averaged loss, progress bar, logs and checkpoints.
            lr_scheduler.step()
            progress["global_step"] += 1
            mean_loss = accelerator.reduce(torch.stack(micro_losses).mean(), reduction="mean").item()
            micro_losses.clear()
            losses.append(mean_loss)
            seconds = time.perf_counter() - step_started
            bar.update(1)
            bar.set_postfix(loss=f"{mean_loss:.4f}", s_per_step=f"{seconds:.2f}")
            lr = lr_scheduler.get_last_lr()[0]
            model_logger.on_step_end(progress["global_step"], mean_loss, lr, _trainable_state(accelerator, module))
            if args.save_steps and progress["global_step"] % args.save_steps == 0:
                checkpoint()
            step_started = time.perf_counter()
            if progress["global_step"] >= total_steps:
                break
        if progress["batch_in_epoch"] >= len(dataloader):
            # The epoch ran to its end: save it and move the data position to the next one.
            model_logger.on_epoch_end(progress["epoch"], _trainable_state(accelerator, module))
            progress["epoch"] += 1
            progress["batch_in_epoch"] = 0
            checkpoint()
    bar.close()
    if saved_step != progress["global_step"]:
        checkpoint()  # a run cut short by --max_train_steps can be continued from here
    model_logger.on_train_end(progress["global_step"], _trainable_state(accelerator, module))
    for placer in [*managers, *swaps]:
        placer.remove()
    return {"global_step": progress["global_step"], "losses": losses}
