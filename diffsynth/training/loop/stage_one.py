"""Stage 1 of split training (``--task *:data_process``): every sample's units run once and are cached."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader, Subset

from ...core.data import UnifiedDataset
from ...core.data.bad_samples import pop_skipped
from ...core.data.cache import cache_file_path, save_cache_sample, write_cache_info, write_cache_manifest
from ...core.data.cache_sync import summarise, sync_stage_one_cache
from ...core.data.fingerprint import digest
from ...core.data.mix import MIX_CACHE_DIR, MIX_MANIFEST_FILE, DatasetMix, write_mix_manifest
from ..config.validation_loss import VALIDATION_CACHE_DIR
from ..objective.training_module import DiffusionTrainingModule
from ..placement.placers import place_models
from .preemption import PreemptionListener, RunPreempted, ignore_stop_signals
from .progress import ProgressReport

if TYPE_CHECKING:
    from ..config import RunConfig

logger = logging.getLogger(__name__)


# oneDNN, which runs torch's convolutions on the CPU, keeps a compiled primitive per input shape (up to 1024), each
# with buffers sized for its shape. Stage 1 meets a new shape with nearly every image (sizes are the images' own unless
# bucketed), so on the CPU the VAE's primitives grew the process by megabytes per sample: a peak of 968 MiB after 50
# images and 1311 after 200; without the cache 670, 664 and 688 for 50, 200 and 800 (scripts/bench_soak.py
# --stage_one). Each convolution then builds its primitive afresh, which cost no measurable time there. oneDNN reads
# the variable once, at its first use, which in stage 1 comes later than this.
ONEDNN_CACHE_VARIABLE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"


def _no_kernel_cache_per_shape(device: Any) -> None:
    """Turns oneDNN's primitive cache off for a CPU stage 1, unless the environment sets its size."""
    if device.type == "cpu":
        os.environ.setdefault(ONEDNN_CACHE_VARIABLE, "0")


def _first(batch: list[Any]) -> Any:
    """One sample per step of stage 1, which runs each sample's units alone."""
    return batch[0]


def signal_name(preemption: PreemptionListener) -> str:
    """The stop signal a run ended by, as its message names it."""
    if preemption.received is None:
        return "a stop signal another process received"
    return signal.Signals(preemption.received).name


def launch_data_process_task(accelerator: Any, dataset: UnifiedDataset | DatasetMix, module: DiffusionTrainingModule,
                             config: RunConfig, command: str | None = None,
                             validation_set: UnifiedDataset | None = None) -> int:
    """Stage 1: runs the stage's units on every sample and writes one cache file per sample; then the same for the
    validation set (``--validation_dataset_metadata_path``), into its own cache ``<output_path>/validation``, which
    ``*:train`` reads for ``--validation_loss_steps``.

    Processes take every ``num_processes``-th sample. A rerun keeps each file whose fingerprint still matches its
    sample, recomputes the others and removes the files of samples that are gone (``cache_sync``); it reports what it
    did on the main process. Samples whose files fail to decode are skipped or stop the run (``--on_bad_sample``).

    Args:
        accelerator: The run's ``accelerate.Accelerator``.
        dataset: The metadata dataset, built with ``keep_row_indices`` (sample ``i`` is row ``i``); a mix of several
            is cached one dataset a folder (``_cache_mix``).
        module: The stage-1 training module.
        config: The run's config.
        command: The command line that reruns this stage, recorded for stage 2's message about a partial cache.
        validation_set: The validation set's metadata dataset (built like ``dataset``), or None.

    Returns:
        The number of samples this process computed (not counting those it kept or skipped), the validation set's
        included.

    Raises:
        RunPreempted: SIGTERM / SIGINT arrived; this process stopped after the sample in progress.
    """
    info = module.cache_info()
    models = digest(module.stage_one_identity())  # before placing: offload leaves no weights to read
    if config.placement.enable_optimizer_cpu_offload:
        logger.warning("--enable_optimizer_cpu_offload is ignored by --task %s: stage 1 trains nothing, so there is "
                       "no optimizer to offload", config.training.task)
    _no_kernel_cache_per_shape(accelerator.device)
    output = config.output.output_path
    place_models(module, accelerator.device, config.placement)  # stage 1 never runs the denoiser, so nothing is swapped
    if isinstance(dataset, DatasetMix):
        computed = _cache_mix(accelerator, dataset, module, config, info, models, command)
    else:
        computed, summary = _cache_samples(accelerator, dataset, module, config, output, info, models, command)
        if accelerator.is_main_process:
            (Path(output) / MIX_MANIFEST_FILE).unlink(missing_ok=True)  # an earlier run's mix: this cache is one set
            print(f"stage 1: {summary}. Cache in {output}; train from it with --task {config.training.family}:train "
                  f"--dataset_base_path {output}")
    if validation_set is not None:
        folder = Path(output) / VALIDATION_CACHE_DIR
        validation_computed, summary = _cache_samples(accelerator, validation_set, module, config, folder, info,
                                                      models, command)
        computed += validation_computed
        if accelerator.is_main_process:
            print(f"stage 1, validation set: {summary}. Cache in {folder}; the {config.training.family}:train run "
                  "measures its loss with --validation_loss_steps N")
    return computed


def _cache_mix(accelerator: Any, mix: DatasetMix, module: DiffusionTrainingModule, config: RunConfig,
               info: dict[str, Any], models: str, command: str | None) -> int:
    """Caches each dataset of ``mix`` into ``<output_path>/datasets/<k>`` and records the parts (their repeats and
    regularization marks) in ``datasets.json`` for stage 2; returns the samples this process computed."""
    output = Path(config.output.output_path)
    computed = 0
    for number, part in enumerate(mix.parts):
        folder = output / MIX_CACHE_DIR / str(number)
        done, summary = _cache_samples(accelerator, part.dataset, module, config, folder, info, models, command)
        computed += done
        if accelerator.is_main_process:
            print(f"stage 1, {part.name}: {summary}. Cache in {folder}")
    if accelerator.is_main_process:
        write_mix_manifest(output, mix.parts)
        print(f"stage 1: {len(mix.parts)} datasets cached in {output}; train from them with --task "
              f"{config.training.family}:train --dataset_base_path {output}")
    return computed


def _cache_samples(accelerator: Any, dataset: UnifiedDataset, module: DiffusionTrainingModule, config: RunConfig,
                   output: str | Path, info: dict[str, Any], models: str, command: str | None) -> tuple[int, str]:
    """Caches ``dataset`` into ``output`` (see :func:`launch_data_process_task`): the samples this process computed,
    and the summary line of every process's counts (main process)."""
    from accelerate.utils import gather_object

    if accelerator.is_main_process:
        write_cache_info(output, info)
    accelerator.wait_for_everyone()
    num_samples = len(dataset.rows)
    sync = sync_stage_one_cache(output, accelerator.process_index, accelerator.num_processes, num_samples,
                                lambda index, stored: dataset.fingerprint(index, models, stored),
                                skipped=dataset.excluded)
    accelerator.wait_for_everyone()
    skipped = {index: bad.describe() for index, bad in dataset.excluded.items()}
    if accelerator.is_main_process:
        # Written once every stale file is gone: from here on the folder holds only samples of this dataset.
        write_cache_manifest(output, num_samples, skipped, command)
    loader = DataLoader(Subset(dataset, sync.todo), batch_size=1, collate_fn=_first,
                        num_workers=config.dataset.dataset_num_workers, worker_init_fn=ignore_stop_signals)
    report = ProgressReport(len(sync.todo), "caching", interval_seconds=config.console.progress_interval_seconds,
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
                save_cache_sample(cache_file_path(output, accelerator.process_index, index), state, info,
                                  sync.fingerprints[index])
            report.update()
            if preemption.requested and done < len(sync.todo):
                raise RunPreempted(f"stage 1 stopped by {signal_name(preemption)} after {done} of the "
                                   f"{len(sync.todo)} samples process {accelerator.process_index} had to compute; "
                                   f"rerun the same command to compute the other {len(sync.todo) - done}", done)
    report.close()
    accelerator.wait_for_everyone()
    counts = gather_object([sync.counts()])
    late = gather_object([(bad.index, bad.describe()) for bad in skipped_here])
    summary = ""
    if accelerator.is_main_process:
        skipped.update(late)
        if late:
            write_cache_manifest(output, num_samples, skipped, command)
        summary = summarise(counts, skipped=len(skipped))
    return len(sync.todo) - len(skipped_here), summary


