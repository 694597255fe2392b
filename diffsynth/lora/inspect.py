"""``inspect``: what a LoRA file is, and how much of it each tool loads, checked on the model's weightless skeleton.

The model comes from the file's own metadata, or from a model folder's ``config.json``. The trainer records the base
model's layer table (``base_layers``), which is all an inspection needs: no model is built and diffusers is not
imported. A file without it (written by an older version) records the model's diffusers class and config, and the
model is built from them on the meta device, as from a folder: no weight is read, but importing diffusers takes
seconds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .base_layers import LAYERS_KEY, BaseLayers
from .formats import MODEL_CLASS_KEY, MODEL_CONFIG_KEY, LoRAWeights
from .naming import naming_for
from .reading import read_file, read_lora
from .tools import ToolResult, check_tools

# The tools that must load the trainer's main file fully; musubi-tuner is reported, and converts with a command.
REQUIRED_TOOLS = ("diffsynth", "diffusers", "ComfyUI", "DiffSynth-Studio")
# Those of a LoHa, LoKr or DoRA file: no other tool here reads them (docs/en/LoRA_Types.md).
LYCORIS_REQUIRED_TOOLS = ("diffsynth", "ComfyUI")


def required_tools(kind: str) -> tuple[str, ...]:
    """The tools that must load a file of adapter type ``kind`` (``lora``, ``lora+dora``, ``loha``, ``lokr``) fully."""
    return REQUIRED_TOOLS if kind == "lora" else LYCORIS_REQUIRED_TOOLS


@dataclass
class Inspection:
    """The findings of :func:`inspect_lora`."""

    path: Path
    model_class: str
    model_source: str
    weights: LoRAWeights
    results: list[ToolResult]

    def result(self, tool: str) -> ToolResult:
        return next(result for result in self.results if result.tool == tool)

    def failing(self, tools: tuple[str, ...] | None = None) -> list[ToolResult]:
        """The results among ``tools`` (default: those the file's type needs, :func:`required_tools`) that do not
        load the whole file at the trained strength."""
        tools = required_tools(self.weights.describe()["type"]) if tools is None else tools
        return [result for result in self.results if result.tool in tools and not result.ok]

    def as_dict(self) -> dict[str, Any]:
        info = self.weights.describe()
        metadata = self.weights.metadata
        return {
            "file": str(self.path), "layout": self.weights.layout, "model": self.model_class,
            "model_from": self.model_source, **info,
            "trained_alpha": metadata.get("diffsynth.lora.alpha", metadata.get("lora_alpha")),
            "tools": [result.__dict__ for result in self.results],
        }  # fmt: skip

    def format(self) -> str:
        """The report as text: what the file is, then a line per tool."""
        info = self.weights.describe()
        lines = [f"file      {self.path}", f"layout    {self.weights.layout}", f"type      {info['type']}",
                 f"model     {self.model_class} (from {self.model_source})",
                 f"layers    {info['layers']}, rank {info['rank'] if info['rank'] is not None else 'mixed'}"]
        if info["scale"] is not None:
            lines.append(f"strength  1.0 = the trained update (alpha/rank = {info['scale']:g}"
                         + (f", alpha {info['alpha']}" if info["alpha"] is not None else "") + ")")
        lines.append(f"targets   {', '.join(info['targets'])}")
        lines.append("")
        lines.append(f"{'tool':<18}{'layers mapped':<16}strength applied at 1.0")
        for result in self.results:
            if result.error is not None:
                strength = f"fails: {_shortened(result.error)}"
            elif result.strength is not None:
                strength = f"{result.strength:.3g}" + ("" if result.ok else "   <- not the trained strength")
            elif result.strengths is not None:
                strength = f"varies {result.strengths[0]:.3g}..{result.strengths[1]:.3g}"
            else:
                strength = "-"
            mapped = f"{result.mapped}/{result.total}"
            lines.append(f"{result.tool:<18}{mapped:<16}{strength}")
            if result.unloaded and not result.ok:
                lines.append(f"{'':<18}unused keys, e.g. {result.unloaded[:3]}")
        if not self.result("musubi-tuner").ok and info["type"] == "lora":
            lines.append(f"\nmusubi-tuner reads its own layout only: python -m diffsynth.lora convert {self.path} "
                         f"{self.path.with_suffix('')}.musubi.safetensors --to kohya")
        return "\n".join(lines)


def _shortened(text: str, limit: int = 200) -> str:
    """A tool's error on one line of the report (diffusers' can list every key of the file)."""
    return text if len(text) <= limit else text[:limit] + " ..."


def base_layers_from_metadata(metadata: Mapping[str, str]) -> BaseLayers | None:
    """The base model a LoRA file's metadata records: its layer table if written, else built from its class and
    config on the meta device; None if the file records no model.

    Raises:
        ValueError: The recorded table is unreadable, or diffusers lacks the recorded class.
    """
    class_name, table = metadata.get(MODEL_CLASS_KEY), metadata.get(LAYERS_KEY)
    if class_name and table:
        return BaseLayers.from_metadata(class_name, table)
    skeleton = skeleton_from_metadata(metadata)
    return None if skeleton is None else BaseLayers.of(skeleton)


def skeleton_from_metadata(metadata: Mapping[str, str]) -> torch.nn.Module | None:
    """The base model the trainer recorded in a LoRA file's metadata, built on the meta device; None if absent."""
    class_name, config = metadata.get(MODEL_CLASS_KEY), metadata.get(MODEL_CONFIG_KEY)
    if not class_name or not config:
        return None
    import diffusers
    from accelerate import init_empty_weights

    cls = getattr(diffusers, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise ValueError(f"the LoRA's metadata names model class {class_name!r}, which diffusers "
                         f"{diffusers.__version__} lacks; pass --model with the model folder")
    with init_empty_weights(include_buffers=False):
        return cls.from_config(json.loads(config))


def skeleton_from_folder(folder: str | os.PathLike) -> torch.nn.Module:
    """The model a folder's ``config.json`` names (a repository root with ``transformer/`` works too), on meta."""
    from ..core.loader.loading import build_empty_model, find_model_class, read_config

    folder = Path(folder)
    if not (folder / "config.json").is_file() and (folder / "transformer" / "config.json").is_file():
        folder = folder / "transformer"
    library, cls = find_model_class(read_config(folder), folder / "config.json")
    return build_empty_model(library, cls, folder, torch.float32)


def inspect_lora(path: str | os.PathLike,
                 model: str | os.PathLike | torch.nn.Module | BaseLayers | None = None) -> Inspection:
    """Reads a LoRA file and emulates each tool's loader on it.

    Args:
        path: The ``.safetensors`` LoRA file.
        model: The base model: a module (weights may be on meta), its :class:`BaseLayers`, a model folder, or None
            to use the model the file's metadata records.

    Raises:
        ValueError: The file is no readable LoRA, or no model is given and the file records none.
    """
    tensors, metadata = read_file(path)
    if isinstance(model, BaseLayers):
        base, source = model, "the given layers"
    elif isinstance(model, torch.nn.Module):
        base, source = BaseLayers.of(model), "the given module"
    elif model is not None:
        base, source = BaseLayers.of(skeleton_from_folder(model)), str(model)
    else:
        base, source = base_layers_from_metadata(metadata), "the file's metadata"
        if base is None:
            raise ValueError(f"{path} does not record its base model (it was not written by this trainer); pass "
                             "--model with the model's folder (the one holding config.json)")
    naming = naming_for(base.model_class)
    shapes = dict(base.shapes)
    weights = read_lora(dict(tensors), shapes, naming, metadata, strict=False)
    results = check_tools(tensors, metadata, base.model_class, shapes, naming)
    return Inspection(Path(path), base.model_class, source, weights, results)
