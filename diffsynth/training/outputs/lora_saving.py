"""Writing the run's LoRA files (``ModelLogger``'s LoRA part): layout, metadata, and the check of the first file.

A plain LoRA is written as :mod:`diffsynth.training.outputs.logger` describes (universal layout, a diffusers-layout
twin where only diffusers cannot take it). A LoHa, LoKr or DoRA file (``--lora_type``, ``--use_dora``) is written in
LyCORIS's key names (:mod:`diffsynth.lora.adapters`), which ComfyUI reads: the first one is required to load fully
in ComfyUI and in this project; diffusers' ``load_lora_weights``, DiffSynth-Studio and musubi-tuner read neither type,
so no diffusers twin is written for them (``python -m diffsynth.lora inspect`` shows each tool's result).
"""

from __future__ import annotations

import enum
import functools
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ...lora.base_layers import LAYERS_KEY, BaseLayers
from ...lora.formats import MODEL_CLASS_KEY, MODEL_CONFIG_KEY, LoRAWeights, from_peft_state_dict, write_lora
from ...lora.inspect import base_layers_from_metadata, inspect_lora, required_tools
from ...lora.naming import naming_for
from ...lora.peft_adapters import weights_from_peft

logger = logging.getLogger("diffsynth.training.outputs.logger")

DIFFUSERS_TWIN_SUFFIX = ".diffusers"


class LoRACompatibilityError(RuntimeError):
    """A LoRA file the trainer wrote would not load fully in a tool users generate with."""


def json_safe(value: Any) -> Any:
    """``value`` as JSON can hold it: enums by value, sets sorted, anything else by its ``str()``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return json_safe(value.value)
    if isinstance(value, Mapping):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if isinstance(value, (set, frozenset)):
        return sorted((json_safe(item) for item in value), key=str)
    return str(value)  # paths, dtypes, devices: their str() is what a reader wants to see


class LoRASaving:
    """The LoRA files of :class:`~diffsynth.training.outputs.logger.ModelLogger` (which provides ``lora_metadata``,
    ``lora_layout``, ``remove_prefix_in_ckpt``, ``is_main_process``, ``save_dtype``, ``_file`` and
    ``_base_metadata``)."""

    _diffusers_twin: bool | None = None  # decided by the first LoRA save

    def _lora_entries(self) -> dict[str, Any]:
        """The metadata that says what the LoRA is for: flags as given, and the base model to inspect it on."""
        entries = {key: self.lora_metadata[key] for key in ("lora_target_modules", "lora_base_model")
                   if self.lora_metadata.get(key) is not None}
        if self.lora_metadata.get("base_model_class"):
            entries[MODEL_CLASS_KEY] = self.lora_metadata["base_model_class"]
            entries[MODEL_CONFIG_KEY] = json.dumps(json_safe(self.lora_metadata.get("base_model_config", {})),
                                                   sort_keys=True)
            if self.lora_metadata.get("base_model_layers") is not None:
                entries[LAYERS_KEY] = self.lora_metadata["base_model_layers"].to_metadata()
        return entries

    def save_lora(self, state_dict: Mapping[str, torch.Tensor], name: str,
                  metadata: Mapping[str, Any] | None = None) -> Path | None:
        """Writes ``<output_path>/<name>.safetensors`` in the run's layout (see the module docstring).

        The first call checks the file against every tool on the base model's layers and decides whether a
        diffusers-layout twin is needed; later calls write the same set of files.

        Args:
            state_dict: The trainable LoRA weights under the training module's names, e.g.
                ``pipe.dit.transformer_blocks.0.attn.to_q.lora_A.default.weight``.
            name: The file name without folder, e.g. ``"epoch-0"``.
            metadata: Extra safetensors metadata entries (stored as strings), e.g. ``{"step": 500}``.

        Returns:
            The main file written, or None on a process other than the main one.

        Raises:
            ValueError: A weight is not a LoRA weight, or the LoRA's rank disagrees with ``lora_metadata``.
            LoRACompatibilityError: The written file would not load fully in a tool users generate with.
        """
        alpha, rank = self.lora_metadata.get("lora_alpha"), self.lora_metadata.get("lora_rank")
        alpha = None if alpha is None else float(alpha)
        kind = self.lora_metadata.get("lora_type", "lora")
        path = self._file(name)
        if kind != "lora":
            if not self.is_main_process:
                return None
            base_weights = self.lora_metadata.get("base_weights")
            weights = weights_from_peft(state_dict, alpha, None if rank is None else int(rank),
                                        self.remove_prefix_in_ckpt, base_weights)
            return self._write_lora_files(path, name, weights, metadata)
        weights = from_peft_state_dict(state_dict, alpha, self.remove_prefix_in_ckpt)
        if rank is not None and weights.ranks != {int(rank)}:
            raise ValueError(f"the LoRA weights have rank {min(weights.ranks)} but --lora_rank is {rank}; save the "
                             "weights of the LoRA this logger was configured for")
        if not self.is_main_process:
            return None
        return self._write_lora_files(path, name, weights, metadata)

    def _write_lora_files(self, path: Path, name: str, weights: LoRAWeights,
                          metadata: Mapping[str, Any] | None) -> Path:
        """Writes the LoRA file (and its diffusers twin, when the first file needed one); checks the first."""
        entries = self._base_metadata({**self._lora_entries(), **(metadata or {})})
        naming = naming_for(self.lora_metadata.get("base_model_class") or "")
        write_lora(path, weights, "kohya" if naming.kohya_only else self.lora_layout, naming, entries,
                   self.save_dtype)
        first = self._diffusers_twin is None
        if first:
            self._diffusers_twin = self._needs_diffusers_twin(path, naming.kohya_only)
        if self._diffusers_twin:
            twin = write_lora(self._file(name + DIFFUSERS_TWIN_SUFFIX), weights, "diffusers", naming, entries,
                              self.save_dtype)
            if first:
                self._require_loading(twin, ("diffusers",))
        return path

    @functools.cached_property
    def _base_layers(self) -> BaseLayers | None:
        """The base model's layers for the checks of the first file and of its twin (built on meta once if the
        training module gave its class and config only)."""
        return self.lora_metadata.get("base_model_layers") or base_layers_from_metadata(
            self._base_metadata(self._lora_entries()))

    def _require_loading(self, path: Path, tools: tuple[str, ...]) -> set[str]:
        """Inspects a file of this run on the base model's layers; returns the tools that would not load it fully.

        Raises:
            LoRACompatibilityError: One of ``tools`` would not load the file fully at its trained strength.
        """
        base = self._base_layers
        if base is None:
            return set()  # the model is unknown (a logger used outside the trainer): nothing to check against
        inspection = inspect_lora(path, base)
        failing = {result.tool for result in inspection.failing()}
        if failing & set(tools):
            raise LoRACompatibilityError(
                f"{path} would not load fully at its trained strength in {', '.join(sorted(failing))}:\n"
                f"{inspection.format()}\nThe file is kept; report this with the flags you used")
        return failing

    def _needs_diffusers_twin(self, path: Path, kohya_only: bool = False) -> bool:
        """Checks the run's first LoRA file: every tool but diffusers must load it; a diffusers twin covers that one.
        A LoHa, LoKr or DoRA file must load in this project and ComfyUI; no other tool reads them, and no twin helps.
        A model whose files are kohya's (``ModuleNaming.kohya_only``, Stable Diffusion) must load in this project,
        ComfyUI and diffusers, with no twin (DiffSynth-Studio reads its own peft names only)."""
        kind = self.lora_metadata.get("lora_type", "lora")
        if kohya_only and kind == "lora":
            self._require_loading(path, ("diffsynth", "ComfyUI", "diffusers"))
            logger.info("the LoRA files are in kohya's layout, for ComfyUI (LoraLoaderModelOnly) and diffusers' "
                        "load_lora_weights at strength 1.0 (DiffSynth-Studio: python -m diffsynth.lora convert "
                        "<file> <file>.peft.safetensors --to peft)")
            return False
        if kind != "lora":
            self._require_loading(path, required_tools(kind))
            logger.info("the %s files are for ComfyUI (LoraLoaderModelOnly) and this project's load_lora, at "
                        "strength 1.0; diffusers' load_lora_weights, DiffSynth-Studio and musubi-tuner do not read "
                        "them (no diffusers twin is written: docs/en/LoRA_Types.md)", kind)
            return False
        if self.lora_layout == "diffusers":
            # The layout a reference aligns to diffusers' names (Krea 2): for diffusers and DiffSynth-Studio.
            self._require_loading(path, ("diffsynth", "diffusers", "DiffSynth-Studio"))
            logger.info("the LoRA files are in diffusers' names, for diffusers' load_lora_weights and DiffSynth-Studio "
                        "at strength 1.0 (ComfyUI and musubi-tuner: python -m diffsynth.lora convert <file> <out> --to "
                        "universal or kohya)")
            return False
        failing = self._require_loading(path, ("diffsynth", "ComfyUI", "DiffSynth-Studio"))
        users = "ComfyUI (LoraLoaderModelOnly), DiffSynth-Studio" + ("" if failing else ", diffusers")
        # The folder is left out: a long path would make this line longer than a log viewer shows.
        logger.info("the LoRA files are for %s, at strength 1.0 (musubi-tuner: python -m diffsynth.lora convert "
                    "<file> <file>.musubi.safetensors --to kohya)", users)
        if failing:
            logger.info("diffusers' loader cannot take every layer of that layout here, so <name>%s.safetensors "
                        "is written next to each file for diffusers' load_lora_weights", DIFFUSERS_TWIN_SUFFIX)
        return "diffusers" in failing
