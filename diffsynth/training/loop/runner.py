"""The training recipe of a task stage under accelerate, top to bottom (``launch_training_task``); stage 1 is
``stage_one.launch_data_process_task``.

Model placement differs from a plain accelerate script in one way: with ``--enable_model_cpu_offload`` the models
stay in host memory under one ``OffloadTrainingManager`` each, and with ``--blocks_to_swap`` the denoiser's blocks
move between host and device. Weights that move cannot be wrapped by DDP, so then the training module is neither
moved nor prepared (only the optimizer and the dataloader are), and each placer averages its model's trainable
gradients across processes in ``after_backward()`` (``placement.placers``). Without either, only the models the stage
computes with move to the device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch.utils.data import Dataset

from ..config.errors import FlagError
from ..objective.training_module import DiffusionTrainingModule
from ..outputs.checkpoint import checkpoint_folder, nothing_left_message
from ..outputs.logger import ModelLogger
from ..outputs.run_report import FAILED, FINISHED, STOPPED, one_line
from .preemption import PreemptionListener, RunPreempted
from .training_loop import TrainingLoop

if TYPE_CHECKING:
    from ..config import RunConfig


def launch_training_task(accelerator: Any, dataset: Dataset, module: DiffusionTrainingModule,
                         model_logger: ModelLogger, config: RunConfig, run_id: str | None = None,
                         resume: tuple[dict, dict, dict] | None = None,
                         on_start: Callable[[], None] | None = None,
                         validation_set: Dataset | None = None) -> dict[str, Any]:
    """Trains ``module`` on ``dataset`` for ``--num_epochs`` (or ``--max_train_steps``) optimizer steps.

    Args:
        accelerator: The run's ``accelerate.Accelerator``.
        dataset: Raw samples (one-stage) or the stage-1 cache (``sft:train``).
        module: The training module; trainable weights already restored when resuming.
        model_logger: Writes LoRA files, metrics and the flags.
        config: The run's config; ``config.training.seed`` must be set.
        run_id: The run's id, recorded in every checkpoint so that pruning tells this run's from others'.
        resume: ``(optimizer_state, scheduler_state, progress)`` from a checkpoint, or None.
        on_start: Writes the run's record (flags, config file); called once everything is placed and the checkpoint
            restored, before the first step, so a resume that cannot run leaves the earlier run's files as they were.
        validation_set: The validation set (raw samples, or its stage-1 cache) whose mean loss is measured every
            ``--validation_loss_steps`` and at the end (``validation_loss``), or None.

    Returns:
        ``{"global_step", "losses", "nonfinite_steps", "skipped_samples", "sample_peaks", "val_losses"}``: the
        optimizer steps done, the mean loss of each (over its micro-batches and the processes; NaN or inf for a
        skipped step), how many steps were skipped as non-finite (over the whole run, resumed parts included), the
        samples replaced because their files failed to decode, for each step samples were rendered at, the peak
        bytes of offloaded weights on the device while rendering and while training (``SampleRenderer.peaks``), and
        the ``(step, validation loss)`` pairs measured.

    The report page ``logs/report.html`` (``live_report``) is written while training and a last time at the end:
    ``finished``, ``failed`` with the error's first line, or ``stopped`` on a signal; the error then goes on.

    Raises:
        FlagError: A resumed checkpoint is at or past the end of this run's schedule: nothing would be trained.
        TrainingDivergedError: ``--max_nonfinite_steps`` steps in a row were non-finite (under DeepSpeed: one).
        RunPreempted: SIGTERM / SIGINT arrived; the step in progress finished, then a checkpoint and the weights file
            of that step were written.
    """
    # Placement, optimizer, batches and schedule, prepared by accelerate; a checkpoint's position and state.
    loop = TrainingLoop(accelerator, dataset, module, model_logger, config, run_id, resume, validation_set)
    if resume is not None and not loop.epochs_left():
        # The checkpoint's position alone passed (output_folder), but the schedule of the data as it is now ends
        # before it (a dataset that shrank): refused as honestly, before the run's record is written.
        step = loop.progress["global_step"]
        raise FlagError([nothing_left_message(
            checkpoint_folder(config.output.output_path, step), step,
            f"this run's schedule has {loop.total_steps} optimizer steps ({config.training.num_epochs} epoch(s) of "
            "the dataset as it is now)", "raise --num_epochs")])
    # The run's record, written only now that the run can start: a failed resume leaves the earlier run's.
    if on_start is not None:
        on_start()
    try:
        with PreemptionListener() as preemption:
            while loop.epochs_left():
                # Data: this epoch's order, without the batches a resumed run already consumed.
                for batch in loop.epoch_batches():
                    # Forward and backward, accumulated over micro-batches; then the checked optimizer step.
                    step = loop.micro_step(batch, preemption.requested)
                    # Bookkeeping of an optimizer step: schedule, guard, logs, checkpoints, samples, the report page.
                    if step is not None and loop.end_step(*step, preemption):
                        break
                # The epoch's end: skipped samples, its weights file and checkpoint, samples.
                loop.end_epoch(preemption)
                if loop.preempted:
                    break
        # A run cut short is checkpointed, then the weights file; the placements are undone.
        result = loop.finish(preemption)
    except (RunPreempted, KeyboardInterrupt) as stopped:  # the report page's last state, then the error goes on
        loop.live.end(STOPPED, one_line(stopped) if str(stopped) else "aborted by a second Ctrl-C",
                      loop.progress["global_step"])
        raise
    except Exception as error:
        loop.live.end(FAILED, one_line(error), loop.progress["global_step"])
        raise
    loop.live.end(FINISHED, step=loop.progress["global_step"])
    return result
