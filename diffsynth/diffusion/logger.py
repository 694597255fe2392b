"""``ModelLogger``: what a training run leaves on disk, namely LoRA files, full checkpoints, its flags and metrics.

LoRA files are written in the layout diffusers' ``load_lora_weights`` loads with no missing or unexpected key, found
by reading diffusers 0.42 (``QwenImageLoraLoaderMixin.lora_state_dict`` and ``PeftAdapterMixin.load_lora_adapter``):

* keys are ``transformer.<module>.lora_A.weight`` / ``.lora_B.weight``. ``load_lora_adapter`` keeps only the keys
  under its component prefix ``transformer.``, so bare keys load nothing (a warning, and the adapter is silently
  absent); peft's adapter name (``.default``) is dropped, as in ``get_peft_model_state_dict``;
* the LoRA scale travels in the ``lora_adapter_metadata`` JSON entry (peft ``LoraConfig`` fields under
  ``transformer.``). Without it diffusers assumes ``lora_alpha == r``, which changes the output whenever the run used
  another alpha.

The same files load into this package's own :func:`diffsynth.core.lora.load_lora`, which reads both entries.
Every file is written atomically, and only by the main process.
"""

from __future__ import annotations

import argparse
import csv
import enum
import importlib
import json
import logging
import os
import re
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from diffsynth import __version__
from diffsynth.core.device import warn_once
from diffsynth.core.files import atomic_save_safetensors, atomic_write_json
from diffsynth.core.finite import require_finite
from diffsynth.core.loader.loading import resolve_dtype

logger = logging.getLogger(__name__)

TRAINING_ARGS_FILE = "training_args.json"
METRICS_FILE = Path("logs") / "metrics.csv"
TENSORBOARD_DIR = Path("logs") / "tensorboard"
# peft's trainable LoRA names: "<module>.lora_A.<adapter>.weight"; the adapter part is absent once exported.
_LORA_KEY = re.compile(r"^(?P<module>.+)\.(?P<part>lora_A|lora_B)(?:\.(?P<adapter>[^.]+))?\.(?P<kind>weight|bias)$")

StateDictFn = Callable[[], Mapping[str, torch.Tensor]]


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return _json_safe(value.value)
    if isinstance(value, Mapping):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_json_safe(item) for item in value), key=str)
    return str(value)  # paths, dtypes, devices: their str() is what a reader wants to see


def diffusers_lora_state_dict(state_dict: Mapping[str, torch.Tensor],
                              component: str = "transformer") -> tuple[dict[str, torch.Tensor], int, list[str]]:
    """Renames peft LoRA weights to the keys diffusers' ``load_lora_weights`` expects.

    Args:
        state_dict: peft names relative to the LoRA's model, e.g. ``blocks.0.attn.to_q.lora_A.default.weight``.
        component: The pipeline attribute diffusers loads the LoRA into (``"transformer"`` for Qwen-Image and Wan).

    Returns:
        ``(renamed state dict, rank, sorted target module names)``.

    Raises:
        ValueError: A key is no LoRA weight, several adapters are mixed, a layer lacks lora_A or lora_B, or the
            layers have different ranks.
    """
    renamed, ranks, parts = {}, {}, {}
    adapters = set()
    for key, tensor in state_dict.items():
        match = _LORA_KEY.match(key)
        if match is None:
            raise ValueError(f"{key!r} is not a peft LoRA weight; save full weights with save_state_dict, or train "
                             f"only the LoRA (drop --trainable_models)")
        if match["adapter"]:
            adapters.add(match["adapter"])
        module = match["module"]
        parts.setdefault(module, set()).add(match["part"])
        if match["part"] == "lora_A" and match["kind"] == "weight":
            ranks[module] = tensor.shape[0]
        renamed[f"{component}.{module}.{match['part']}.{match['kind']}"] = tensor
    if len(adapters) > 1:
        raise ValueError(f"the state dict mixes peft adapters {sorted(adapters)}; pass the weights of one adapter")
    incomplete = sorted(module for module, found in parts.items() if found != {"lora_A", "lora_B"})
    if incomplete:
        raise ValueError(f"LoRA layers {incomplete[:5]} lack their lora_A or lora_B weight; pass the whole adapter")
    if not renamed:
        raise ValueError("the state dict holds no LoRA weight; is a LoRA injected (--lora_base_model)?")
    if len(set(ranks.values())) > 1:
        counts = Counter(ranks.values())
        raise ValueError(f"LoRA layers have different ranks {dict(counts)}; diffusers' metadata here holds one rank")
    return renamed, next(iter(ranks.values())), sorted(parts)


def _import_for_flag(module: str, flag: str, fix: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"--{flag} needs a package that is missing ({error}); {fix}, or drop --{flag}") from None


class ModelLogger:
    """Writes LoRA files, full checkpoints, the run's flags and its metrics under ``output_path``.

    Every process makes one, so that all of them call ``state_dict_fn`` at the same save points (gathering sharded
    weights can be a collective operation); only the one with ``is_main_process`` writes anything.

    Args:
        output_path: Folder for everything written; created if missing.
        remove_prefix_in_ckpt: Prefix removed from the training module's weight names (``pipe.dit.``), leaving names
            relative to the model. Keys without it are kept as they are.
        lora_metadata: The LoRA's settings, stored in each LoRA file: ``lora_rank``, ``lora_alpha`` (None or absent
            means equal to the rank, the flag's default), ``lora_target_modules``, ``lora_base_model``.
        enable_csv_log: Append metrics to ``logs/metrics.csv``.
        enable_tensorboard_log: Write TensorBoard events to ``logs/tensorboard``.
        enable_wandb_log: Log metrics (and the flags, via :meth:`save_training_args`) to Weights & Biases.
        wandb_project: The Weights & Biases project.
        is_main_process: Whether this process writes.
        save_steps: Save every this many optimizer steps in :meth:`on_step_end`; None saves per epoch only.
        save_dtype: Storage dtype of floating weights, e.g. ``"bfloat16"`` for half-size files; None keeps the
            training dtype.
        lora_component: The pipeline attribute diffusers loads the LoRA into.

    Raises:
        ImportError: TensorBoard or wandb logging is asked for but its package is missing (checked on every process,
            so no rank waits forever for one that failed).
        ValueError: ``save_steps``, ``save_dtype`` or the LoRA rank or alpha is invalid.
    """

    def __init__(self, output_path: str | os.PathLike, remove_prefix_in_ckpt: str | None = "pipe.dit.",
                 lora_metadata: Mapping[str, Any] | None = None, enable_csv_log: bool = False,
                 enable_tensorboard_log: bool = False, enable_wandb_log: bool = False,
                 wandb_project: str = "diffsynth", is_main_process: bool = True, *, save_steps: int | None = None,
                 save_dtype: torch.dtype | str | None = None, lora_component: str = "transformer"):
        self.output_path = Path(output_path)
        self.remove_prefix_in_ckpt = remove_prefix_in_ckpt or ""
        self.lora_metadata = dict(lora_metadata or {})
        self.is_main_process = is_main_process
        self.save_steps = save_steps
        self.save_dtype = None if save_dtype is None else resolve_dtype(save_dtype, "save_dtype")
        self.lora_component = lora_component
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
        self._tensorboard = self._wandb_run = None
        self._unsaved = False
        if not is_main_process:
            return
        self.output_path.mkdir(parents=True, exist_ok=True)
        if enable_csv_log:
            self._open_csv(self.output_path / METRICS_FILE)
        if tensorboard is not None:
            self._tensorboard = tensorboard.SummaryWriter(log_dir=str(self.output_path / TENSORBOARD_DIR))
        if wandb is not None:
            self._wandb_run = wandb.init(project=wandb_project, dir=str(self.output_path))

    @classmethod
    def from_args(cls, args: argparse.Namespace, is_main_process: bool = True,
                  lora_metadata: Mapping[str, Any] | None = None) -> ModelLogger:
        """Builds the logger from the trainer flags (see :mod:`diffsynth.diffusion.parsers`).

        ``lora_metadata`` overrides the LoRA settings read from the flags (the training module knows the module
        names the targets resolved to).
        """
        if lora_metadata is None and args.lora_base_model:
            lora_metadata = {key: getattr(args, key) for key in
                             ("lora_rank", "lora_alpha", "lora_target_modules", "lora_base_model")}
        return cls(args.output_path, args.remove_prefix_in_ckpt, lora_metadata, enable_csv_log=args.enable_csv_log,
                   enable_tensorboard_log=args.enable_tensorboard_log, enable_wandb_log=args.enable_wandb_log,
                   wandb_project=args.wandb_project, is_main_process=is_main_process, save_steps=args.save_steps)

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

    def save_lora(self, state_dict: Mapping[str, torch.Tensor], name: str,
                  metadata: Mapping[str, Any] | None = None) -> Path | None:
        """Writes ``<output_path>/<name>.safetensors`` as a LoRA file that diffusers' ``load_lora_weights`` loads.

        Args:
            state_dict: The trainable LoRA weights under the training module's names, e.g.
                ``pipe.dit.transformer_blocks.0.attn.to_q.lora_A.default.weight``.
            name: The file name without folder, e.g. ``"epoch-0"``.
            metadata: Extra safetensors metadata entries (stored as strings), e.g. ``{"step": 500}``.

        Returns:
            The file written, or None on a process other than the main one.

        Raises:
            ValueError: A weight is not a LoRA weight, or the LoRA's rank disagrees with ``lora_metadata``.
        """
        renamed, rank, modules = diffusers_lora_state_dict(self._strip_prefix(state_dict), self.lora_component)
        configured_rank = self.lora_metadata.get("lora_rank")
        if configured_rank is not None and int(configured_rank) != rank:
            raise ValueError(f"the LoRA weights have rank {rank} but --lora_rank is {configured_rank}; save the "
                             f"weights of the LoRA this logger was configured for")
        alpha = self.lora_metadata.get("lora_alpha")
        alpha = rank if alpha is None else float(alpha)
        alpha = int(alpha) if float(alpha).is_integer() else alpha  # peft and its users expect an int alpha
        adapter_config = {"r": rank, "lora_alpha": alpha, "target_modules": modules}
        if any(key.endswith(".lora_B.bias") for key in renamed):
            adapter_config["lora_bias"] = True
        entries = {
            "lora_rank": rank,
            "lora_alpha": alpha,
            "lora_layers": len(modules),
            "lora_adapter_metadata": json.dumps({f"{self.lora_component}.{key}": value
                                                 for key, value in adapter_config.items()}, sort_keys=True),
        }
        for key in ("lora_target_modules", "lora_base_model"):
            if self.lora_metadata.get(key) is not None:
                entries[key] = self.lora_metadata[key]
        entries.update(metadata or {})
        path = self._file(name)
        if not self.is_main_process:
            return None
        tensors = {key: self._to_storage(tensor) for key, tensor in renamed.items()}
        return atomic_save_safetensors(tensors, path, self._base_metadata(entries))

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
        this package loads but diffusers' ``load_lora_weights`` does not. A LoRA that cannot be written in diffusers'
        layout is saved as it is, with a warning: at the end of a long run, losing the weights is the worse failure.

        Raises:
            NonFiniteTensorError: A weight holds NaN or inf; nothing is written (checked on every process, which all
                hold the same weights, so all of them stop together).
        """
        require_finite(state_dict, f"not writing {self._file(name)}: the trained weights")
        prefix = self.remove_prefix_in_ckpt
        is_lora = bool(state_dict) and all(key.startswith(prefix) and _LORA_KEY.match(key.removeprefix(prefix))
                                           for key in state_dict)
        path = None
        if is_lora:
            try:
                path = self.save_lora(state_dict, name, metadata)
            except ValueError as error:
                is_lora = False
                logger.warning("%s: saving the weights as they are, not as a diffusers LoRA file (%s)", name, error)
        if not is_lora:
            path = self.save_state_dict(state_dict, name, metadata)
        self._unsaved = False
        return path

    def on_step_end(self, step: int, loss: float | torch.Tensor, lr: float, state_dict_fn: StateDictFn,
                    metrics: Mapping[str, float | torch.Tensor] | None = None) -> Path | None:
        """Logs the step's loss, learning rate and ``metrics``, and saves ``step-<step>`` every ``save_steps``
        optimizer steps.

        Call it on every process after each optimizer step; ``step`` counts optimizer steps from 1.
        """
        self.log_metrics(step, {"loss": loss, "lr": lr, **(metrics or {})})
        self._unsaved = True
        if self.save_steps is None or step % self.save_steps:
            return None
        return self.save_checkpoint(state_dict_fn(), f"step-{step}", {"step": step})

    def on_epoch_end(self, epoch: int, state_dict_fn: StateDictFn) -> Path | None:
        """Saves ``epoch-<epoch>``; call it on every process at the end of each epoch."""
        return self.save_checkpoint(state_dict_fn(), f"epoch-{epoch}", {"epoch": epoch})

    def on_train_end(self, step: int, state_dict_fn: StateDictFn) -> Path | None:
        """Saves ``step-<step>`` if the last steps are in no file yet (a run cut short by ``--max_train_steps``)."""
        if not self._unsaved:
            return None
        return self.save_checkpoint(state_dict_fn(), f"step-{step}", {"step": step})

    def save_training_args(self, args: argparse.Namespace | Mapping[str, Any]) -> Path | None:
        """Writes the run's flags to ``<output_path>/training_args.json`` (and to the wandb run's config)."""
        if not self.is_main_process:
            return None
        payload = _json_safe(vars(args) if isinstance(args, argparse.Namespace) else args)
        if self._wandb_run is not None:
            self._wandb_run.config.update(payload, allow_val_change=True)
        return atomic_write_json(self.output_path / TRAINING_ARGS_FILE, payload)

    def _open_csv(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            with open(path, "rb+") as handle:
                content = handle.read()
                complete = content.rfind(b"\n") + 1
                if complete < len(content):  # a run killed mid-row left half a line; it must not glue onto the next
                    handle.truncate(complete)
            if complete:
                self._csv_header = next(csv.reader([content[:content.find(b"\n")].decode("utf-8")]))
        self._csv_file = open(path, "a", newline="", encoding="utf-8")
        self._csv_writer = csv.writer(self._csv_file, lineterminator="\n")

    def log_metrics(self, step: int, metrics: Mapping[str, float | torch.Tensor]) -> None:
        """Records ``metrics`` at ``step`` in every enabled sink; the CSV row reaches the OS before this returns.

        The CSV columns are fixed by its first row (or, when appending to an earlier run's file, by that file's
        header); metrics missing from a row leave the cell empty, new ones are left out of the CSV with a warning.
        """
        if not self.is_main_process:
            return
        values = {key: float(value) for key, value in metrics.items()}
        if self._csv_writer is not None:
            if self._csv_header is None:
                self._csv_header = ["step", *values]
                self._csv_writer.writerow(self._csv_header)
            extra = sorted(set(values) - set(self._csv_header))
            if extra:
                warn_once(f"metrics-csv-{extra}", f"metrics {extra} are not columns of {METRICS_FILE} (columns "
                                                  f"{self._csv_header}); they are left out of the CSV")
            self._csv_writer.writerow([step if column == "step" else values.get(column, "")
                                       for column in self._csv_header])
            self._csv_file.flush()
        if self._tensorboard is not None:
            for key, value in values.items():
                self._tensorboard.add_scalar(key, value, step)
            self._tensorboard.flush()
        if self._wandb_run is not None:
            self._wandb_run.log(values, step=step)

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
