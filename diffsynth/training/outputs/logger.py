"""``ModelLogger``: what a training run leaves on disk, namely LoRA files, full checkpoints, its flags and metrics.

LoRA files are written in the ``universal`` layout of :mod:`diffsynth.lora.formats`: keys
``diffusion_model.<layer name of the original release>.lora_A.weight`` / ``.lora_B.weight`` with the scale
``alpha / rank`` folded into ``lora_B``, which diffusers, ComfyUI and DiffSynth-Studio all load fully at strength 1.0
(musubi-tuner after ``python -m diffsynth.lora convert ... --to kohya``). The first save of a run checks that on the
model's layer table (``python -m diffsynth.lora inspect`` does the same by hand): a file a required tool would not load
fully stops the run, except that where only diffusers cannot take it (its Wan converter skips some layers) a
diffusers-layout twin ``<name>.diffusers.safetensors`` is written next to every file. ``--align_to_opensource_format``
writes the ``kohya`` layout instead (for FLUX.1 BFL's fused names, as the reference writes them), checked the same
way. After every save the loss curve ``logs/loss.png`` is redrawn (:mod:`diffsynth.training.outputs.loss_chart`).
Every file is written atomically, and only by the main process.

A model trained in full (``--trainable_models``) is written as ``--full_checkpoint_format`` asks
(:mod:`diffsynth.training.outputs.full_model`): the flat file ``<name>.safetensors`` (the default), its diffusers
folder ``<name>.<model>/``, its original release's layout. The flat file is left out only when it is not asked for
and every trained weight is in a folder or file of its model; under ZeRO-3 the models are then read block by block,
never gathered whole.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ... import __version__
from ...core.files import atomic_save_safetensors, atomic_write_json
from ...core.finite import require_finite
from ...core.loader.loading import resolve_dtype
from ...core.written_files import record_written
from ...lora.peft_adapters import is_peft_adapter_key
from ..config.errors import FlagError
from ..config.output import AUTO
from .full_model import DEFAULT_MAX_SHARD_SIZE, DIFFUSERS, FLAT, original_layout_problem, write_full_model
from .lora_saving import DIFFUSERS_TWIN_SUFFIX, LoRACompatibilityError, LoRASaving, json_safe  # noqa: F401 - the names callers import from here
from .loss_chart import LOSS_CHART_FILE, LossHistory, draw_loss_chart
from .metrics_log import METRICS_FILE, MetricsLogging

if TYPE_CHECKING:
    from ..config import RunConfig

logger = logging.getLogger(__name__)

TRAINING_ARGS_FILE = "training_args.json"
SAMPLES_DIR = "samples"  # samples while training: samples/step-N/
TENSORBOARD_DIR = Path("logs") / "tensorboard"

StateDictFn = Callable[[], Mapping[str, torch.Tensor]]


def _import_for_flag(module: str, flag: str, fix: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"--{flag} needs a package that is missing ({error}); {fix}, or drop --{flag}") from None


class ModelLogger(LoRASaving, MetricsLogging):
    """Writes LoRA files, full checkpoints, the run's flags and its metrics under ``output_path``.

    Every process makes one, so that all of them call ``state_dict_fn`` at the same save points (gathering sharded
    weights can be a collective operation); only the one with ``is_main_process`` writes anything.

    Args:
        output_path: Folder for everything written; created if missing.
        remove_prefix_in_ckpt: Prefix removed from the training module's weight names (``pipe.dit.``), leaving names
            relative to the model. Keys without it are kept as they are.
        lora_metadata: The LoRA's settings: ``lora_rank``, ``lora_alpha`` (None or absent means equal to the rank,
            the flag's default), ``lora_target_modules``, ``lora_base_model``, and the base model's diffusers class
            and config (``base_model_class``, ``base_model_config``) and its
            :class:`~diffsynth.lora.base_layers.BaseLayers` (``base_model_layers``) that each file records for
            inspection.
        enable_csv_log: Append metrics to ``logs/metrics.csv``.
        enable_tensorboard_log: Write TensorBoard events to ``logs/tensorboard``.
        enable_wandb_log: Log metrics (and the flags, via :meth:`save_training_args`) to Weights & Biases.
        wandb_project: The Weights & Biases project.
        is_main_process: Whether this process writes.
        save_steps: Save every this many optimizer steps in :meth:`on_step_end`; None saves per epoch only.
        save_dtype: Storage dtype of floating weights, e.g. ``"bfloat16"`` for half-size files; None keeps the
            training dtype.
        resume_step: The optimizer step a resumed run continues from: CSV rows of later steps (logged before the run
            was stopped past its checkpoint) are dropped, and TensorBoard discards its events after that step, so
            every step appears once, when the first row is written (so a run that fails before its first step
            changes nothing of the earlier run's log). None keeps what is there.
        lora_layout: ``universal`` (default), or what ``--align_to_opensource_format`` selects (``kohya``, or
            ``diffusers`` for a family whose reference aligns to diffusers' names: Krea 2), the layout of the LoRA
            files.
        full_checkpoint_formats: What a model trained in full is written as (``--full_checkpoint_format``): any of
            ``flat``, ``diffusers``, ``original``, or ``auto`` alone (resolved by :meth:`attach_full_models`, which
            names the models: flat and diffusers, or flat where a model trained in full carries a LoRA).
        max_shard_size: Bytes per safetensors shard of a diffusers folder.

    Raises:
        ImportError: TensorBoard or wandb logging is asked for but its package is missing (checked on every process,
            so no rank waits forever for one that failed).
        ValueError: ``save_steps``, ``save_dtype`` or the LoRA rank or alpha is invalid.
    """

    def __init__(self, output_path: str | os.PathLike, remove_prefix_in_ckpt: str | None = "pipe.dit.",
                 lora_metadata: Mapping[str, Any] | None = None, enable_csv_log: bool = False,
                 enable_tensorboard_log: bool = False, enable_wandb_log: bool = False,
                 wandb_project: str = "diffsynth", is_main_process: bool = True, *, save_steps: int | None = None,
                 save_dtype: torch.dtype | str | None = None, resume_step: int | None = None,
                 lora_layout: str = "universal", full_checkpoint_formats: tuple[str, ...] = (FLAT,),
                 max_shard_size: int = DEFAULT_MAX_SHARD_SIZE):
        self.output_path = Path(output_path)
        self.remove_prefix_in_ckpt = remove_prefix_in_ckpt or ""
        self.lora_metadata = dict(lora_metadata or {})
        self.is_main_process = is_main_process
        self.save_steps = save_steps
        self.save_dtype = None if save_dtype is None else resolve_dtype(save_dtype, "save_dtype")
        self._diffusers_twin: bool | None = None  # decided by the first LoRA save
        if lora_layout not in ("universal", "kohya", "diffusers"):
            raise ValueError(f"lora_layout={lora_layout!r} must be 'universal', 'kohya' or 'diffusers'")
        self.lora_layout = lora_layout
        self.full_checkpoint_formats = tuple(full_checkpoint_formats)
        self.max_shard_size = max_shard_size
        self.full_models: dict[str, torch.nn.Module] = {}  # pipeline name -> model trained in full
        self.key_prefix = "pipe."
        # The name of the newest save point (epoch-0, step-500): the stem of its flat file, the start of its folders.
        self.last_saved_name: str | None = None
        if save_steps is not None and save_steps < 1:
            raise ValueError(f"--save_steps {save_steps} must be at least 1; pass e.g. --save_steps 500 or drop it")
        rank, alpha = self.lora_metadata.get("lora_rank"), self.lora_metadata.get("lora_alpha")
        if rank is not None and int(rank) < 1:
            raise ValueError(f"--lora_rank {rank} must be at least 1; pass e.g. --lora_rank 32")
        if alpha is not None and float(alpha) <= 0:
            raise ValueError(f"--lora_alpha {alpha} must be positive; pass e.g. --lora_alpha 32, or drop it")
        tensorboard = wandb = None
        if enable_tensorboard_log:
            tensorboard = _import_for_flag("torch.utils.tensorboard", "enable_tensorboard_log",
                                           "run `pip install tensorboard`")
        if enable_wandb_log:
            wandb = _import_for_flag("wandb", "enable_wandb_log", "run `pip install wandb` and `wandb login`")
        self._csv_file = self._csv_writer = self._csv_header = None
        # The CSV opens at the first row: a resume that fails before its first step leaves the earlier run's intact.
        self._csv_pending: tuple[Path, int | None, bytes | None] | None = None
        self._csv_recorded = False
        self._tensorboard = self._wandb_run = None
        self._unsaved = False
        self.loss_history = LossHistory()
        if not is_main_process:
            return
        self.output_path.mkdir(parents=True, exist_ok=True)
        metrics = self.output_path / METRICS_FILE
        # A resume reads the earlier run's metrics once: for the chart, and to continue the CSV at the first row.
        earlier = metrics.read_bytes() if resume_step is not None and metrics.is_file() else None
        if enable_csv_log:
            self._csv_pending = (metrics, resume_step, earlier)
        if resume_step is not None:  # the chart shows the whole run when the earlier part was logged
            self.loss_history = LossHistory.from_metrics_text((earlier or b"").decode("utf-8"), resume_step)
        if tensorboard is not None:
            purge = {} if resume_step is None else {"purge_step": resume_step + 1}
            log_dir = self.output_path / TENSORBOARD_DIR
            earlier = set(log_dir.glob("*"))
            self._tensorboard = tensorboard.SummaryWriter(log_dir=str(log_dir), **purge)
            self._tensorboard.flush()
            for path in sorted(set(log_dir.glob("*")) - earlier):  # the events file it opened (it appends to it)
                record_written(path, grows=True)
        if wandb is not None:
            self._wandb_run = wandb.init(project=wandb_project, dir=str(self.output_path))

    @classmethod
    def from_config(cls, run: RunConfig, is_main_process: bool = True,
                    lora_metadata: Mapping[str, Any] | None = None, resume_step: int | None = None,
                    aligned_lora_layout: str = "kohya") -> ModelLogger:
        """Builds the logger from the run's config.

        ``lora_metadata`` overrides the LoRA settings read from the flags (the training module knows the module
        names the targets resolved to); ``resume_step`` is the step of the checkpoint a resumed run starts from;
        ``aligned_lora_layout`` is the layout ``--align_to_opensource_format`` selects (the pipeline's).
        """
        lora, output = run.lora, run.output
        if lora_metadata is None and lora.lora_base_model:
            lora_metadata = {key: getattr(lora, key) for key in
                             ("lora_rank", "lora_alpha", "lora_target_modules", "lora_base_model")}
        return cls(output.output_path, output.remove_prefix_in_ckpt, lora_metadata,
                   enable_csv_log=output.enable_csv_log, enable_tensorboard_log=output.enable_tensorboard_log,
                   enable_wandb_log=output.enable_wandb_log, wandb_project=output.wandb_project,
                   is_main_process=is_main_process, save_steps=output.save_steps, resume_step=resume_step,
                   lora_layout=aligned_lora_layout if lora.align_to_opensource_format else "universal",
                   full_checkpoint_formats=output.full_checkpoint_formats)

    def attach_full_models(self, models: Mapping[str, torch.nn.Module], key_prefix: str = "pipe.") -> None:
        """Names the models trained in full, so that each save point writes them as ``full_checkpoint_formats`` asks.

        Their weights are the state dict entries under ``<key_prefix><name>.`` (the training module's names). Call it
        on every process before training, with the models as they will be at the save points (the same objects
        DeepSpeed partitions in place).

        Raises:
            FlagError: ``--full_checkpoint_format`` asks for a layout without a model to write in it (a LoRA-only run),
                for a model that also carries a LoRA, or for ``original`` where a model's release has no layout of its
                own; checked before training.
        """
        if self.full_checkpoint_formats == (AUTO,):
            with_lora = any(is_peft_adapter_key(key) for model in models.values()
                            for key, _ in model.named_parameters())
            # A model without a config of its own (Qwen-Image's Blockwise ControlNets, held as a list) has no folder.
            configless = any(not hasattr(model, "config") for model in models.values())
            self.full_checkpoint_formats = (FLAT,) if with_lora or configless or not models else (FLAT, DIFFUSERS)
        formats = self.full_checkpoint_formats
        asked = [layout for layout in formats if layout != FLAT]
        problems = []
        if asked and not models:
            problems.append(f"--full_checkpoint_format {','.join(formats)}: {' and '.join(asked)} writes the models "
                            "trained in full, and this run trains none; add --trainable_models dit, or drop the flag "
                            "(a LoRA is written as one LoRA file)")
        if "original" in formats:
            problems += [problem for name, model in models.items() if (problem := original_layout_problem(name, model))]
        if DIFFUSERS in formats:
            problems += [f"--full_checkpoint_format {','.join(formats)}: {name} ({type(model).__name__}) has no config "
                         "of its own to write a diffusers folder with; keep the flat format only"
                         for name, model in models.items() if not hasattr(model, "config")]
        if asked:
            problems += [f"--full_checkpoint_format {','.join(formats)}: {name} is trained in full and carries a LoRA; "
                         f"its folder would mix both: drop --lora_base_model {name} or keep the flat format only"
                         for name, model in models.items()
                         if any(is_peft_adapter_key(key) for key, _ in model.named_parameters())]
        if problems:
            raise FlagError(problems)
        self.key_prefix = key_prefix
        self.full_models = dict(models)

    def _strip_prefix(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        prefix = self.remove_prefix_in_ckpt
        return {key.removeprefix(prefix): tensor for key, tensor in state_dict.items()}

    def _to_storage(self, tensor: torch.Tensor) -> torch.Tensor:
        dtype = self.save_dtype if self.save_dtype is not None and tensor.is_floating_point() else tensor.dtype
        return tensor.detach().to(device="cpu", dtype=dtype)

    def _file(self, name: str) -> Path:
        stem = name.removesuffix(".safetensors")
        if not stem or Path(stem).name != stem or stem in (".", ".."):
            raise ValueError(f"checkpoint name {name!r} must be a plain file name such as 'epoch-0'")
        return self.output_path / f"{stem}.safetensors"

    def _base_metadata(self, metadata: Mapping[str, Any] | None) -> dict[str, str]:
        entries = {"format": "pt", "diffsynth_version": __version__}
        if self.save_dtype is not None:
            entries["dtype"] = str(self.save_dtype).removeprefix("torch.")
        # A list such as the training module's target modules reads best as the comma list the flag takes.
        entries.update({key: ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
                        for key, value in (metadata or {}).items()})
        return entries

    def save_state_dict(self, state_dict: Mapping[str, torch.Tensor], name: str,
                        metadata: Mapping[str, Any] | None = None) -> Path | None:
        """Writes full (non-LoRA) trainable weights to ``<output_path>/<name>.safetensors`` with the prefix removed.

        Returns:
            The file written, or None on a process other than the main one.
        """
        path = self._file(name)
        if not self.is_main_process:
            return None
        tensors = {key: self._to_storage(tensor) for key, tensor in self._strip_prefix(state_dict).items()}
        return atomic_save_safetensors(tensors, path, self._base_metadata(metadata))

    def save_checkpoint(self, state_dict: Mapping[str, torch.Tensor], name: str,
                        metadata: Mapping[str, Any] | None = None) -> Path | None:
        """Saves a LoRA file when every weight is a LoRA weight under the prefix, otherwise the full weights.

        Mixed runs (a LoRA plus ``--trainable_models``) therefore keep everything they trained, in one file that
        this package loads but diffusers' ``load_lora_weights`` does not. A LoRA that cannot be written as a LoRA file
        is saved as it is, with a warning: at the end of a long run, losing the weights is the worse failure. The
        models named by :meth:`attach_full_models` are also written in the other layouts of
        ``full_checkpoint_formats`` (their weights from ``state_dict``, e.g. EMA weights); the flat file is left out
        only when ``flat`` is not asked for and every weight belongs to one of them. The loss chart ``logs/loss.png``
        is then redrawn with every step logged so far.

        Returns:
            The flat or LoRA file, else the first full-model folder or file written; None on other processes.

        Raises:
            NonFiniteTensorError: A weight holds NaN or inf; nothing is written (checked on every process, which all
                hold the same weights, so all of them stop together).
        """
        require_finite(state_dict, f"not writing {self._file(name)}: the trained weights")
        prefix = self.remove_prefix_in_ckpt
        is_lora = bool(state_dict) and all(key.startswith(prefix) and is_peft_adapter_key(key.removeprefix(prefix))
                                           for key in state_dict)
        path = None
        if is_lora:
            try:
                path = self.save_lora(state_dict, name, metadata)
            except ValueError as error:
                is_lora = False
                logger.warning("%s: saving the weights as they are, not as a LoRA file (%s)", name, error)
        full = [] if is_lora else self._save_full_models(state_dict, name, metadata)
        if not is_lora and (FLAT in self.full_checkpoint_formats or not self._all_in_full_models(state_dict)):
            path = self.save_state_dict(state_dict, name, metadata)
        self._saved(name)
        return path or (full[0] if full else None)

    def _saved(self, name: str) -> None:
        """After a save point: nothing unsaved, and the loss chart redrawn with every step logged so far."""
        self.last_saved_name = name
        self._unsaved = False
        if self.is_main_process and self.loss_history.steps:
            draw_loss_chart(self.loss_history, self.output_path / LOSS_CHART_FILE,
                            title=f"{self.output_path.name}: loss per optimizer step")

    def _model_prefix(self, model_name: str) -> str:
        return f"{self.key_prefix}{model_name}."

    def _all_in_full_models(self, state_dict: Mapping[str, torch.Tensor]) -> bool:
        prefixes = tuple(self._model_prefix(name) for name in self.full_models)
        return bool(prefixes) and all(key.startswith(prefixes) for key in state_dict)

    def _save_full_models(self, state_dict: Mapping[str, torch.Tensor] | None, name: str,
                          metadata: Mapping[str, Any] | None) -> list[Path]:
        """Writes every model trained in full as ``full_checkpoint_formats`` asks (``flat`` is the caller's), from
        ``state_dict`` (the training module's names) or, when None, from the models themselves block by block."""
        formats = tuple(layout for layout in self.full_checkpoint_formats if layout != FLAT)
        if not formats:
            return []
        written = []
        for model_name, model in self.full_models.items():
            weights = None
            if state_dict is not None:
                prefix = self._model_prefix(model_name)
                weights = {key[len(prefix):]: tensor for key, tensor in state_dict.items() if key.startswith(prefix)}
            written += write_full_model(model, self.output_path, name, model_name, formats, weights,
                                        dtype=self.save_dtype, max_shard_size=self.max_shard_size,
                                        is_main_process=self.is_main_process, metadata=self._base_metadata(metadata))
        return written

    def _save_point(self, state_dict_fn: StateDictFn, name: str, metadata: Mapping[str, Any]) -> Path | None:
        """A save point of the run. Without a LoRA and without the flat file, the models are read block by block
        (under ZeRO-3 gathered a block at a time) instead of through ``state_dict_fn``, which gathers them whole."""
        if FLAT in self.full_checkpoint_formats or not self.full_models or self.lora_metadata.get("lora_base_model"):
            return self.save_checkpoint(state_dict_fn(), name, metadata)
        written = self._save_full_models(None, name, metadata)
        self._saved(name)
        return written[0] if written else None

    def on_step_end(self, step: int, loss: float | torch.Tensor, lr: float, state_dict_fn: StateDictFn,
                    metrics: Mapping[str, float | torch.Tensor | None] | None = None) -> Path | None:
        """Logs the step's loss, learning rate and ``metrics``, and saves ``step-<step>`` every ``save_steps``
        optimizer steps.

        Call it on every process after each optimizer step; ``step`` counts optimizer steps from 1.
        """
        self.log_metrics(step, {"loss": loss, "lr": lr, **(metrics or {})})
        if self.is_main_process:
            self.loss_history.add(step, float(loss), float(lr))
        self._unsaved = True
        if self.save_steps is None or step % self.save_steps:
            return None
        return self._save_point(state_dict_fn, f"step-{step}", {"step": step})

    def on_epoch_end(self, epoch: int, state_dict_fn: StateDictFn) -> Path | None:
        """Saves ``epoch-<epoch>``; call it on every process at the end of each epoch."""
        return self._save_point(state_dict_fn, f"epoch-{epoch}", {"epoch": epoch})

    def on_train_end(self, step: int, state_dict_fn: StateDictFn) -> Path | None:
        """Saves ``step-<step>`` if the last steps are in no file yet (a run cut short by ``--max_train_steps``)."""
        if not self._unsaved:
            return None
        return self._save_point(state_dict_fn, f"step-{step}", {"step": step})

    def save_training_args(self, flags: Mapping[str, Any]) -> Path | None:
        """Writes the run's flags to ``<output_path>/training_args.json`` (and to the wandb run's config)."""
        if not self.is_main_process:
            return None
        payload = json_safe(flags)
        if self._wandb_run is not None:
            self._wandb_run.config.update(payload, allow_val_change=True)
        return atomic_write_json(self.output_path / TRAINING_ARGS_FILE, payload)

    def close(self) -> None:
        """Closes the CSV file, the TensorBoard writer and the wandb run."""
        if self._csv_file is not None:
            self._csv_file.close()
            self._csv_file = self._csv_writer = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        if self._wandb_run is not None:
            self._wandb_run.finish()
            self._wandb_run = None

    def __enter__(self) -> ModelLogger:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
