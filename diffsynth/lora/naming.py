"""The LoRA side of layer naming: which layers a LoRA can wrap, and each model's native naming from its family.

The naming classes live in ``diffusion.module_naming`` (a family declares its own naming in its room); they are
re-exported here for the LoRA code.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..diffusion.module_naming import DIFFUSERS_NAMING, FusedLayer, FusedNaming, ModuleNaming
from ..pipelines.registry import family_of_class, load

__all__ = ["DIFFUSERS_NAMING", "LORA_TARGET_TYPES", "FusedLayer", "FusedNaming", "ModuleNaming", "lora_layer_names",
           "lora_layers", "naming_for"]

LORA_TARGET_TYPES = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)


def naming_for(model: torch.nn.Module | str) -> ModuleNaming:
    """The native naming of ``model`` (a module or its diffusers class name), from its family's spec; diffusers'
    own names for classes no family trains."""
    class_name = model if isinstance(model, str) else type(model).__name__
    spec = family_of_class(class_name)
    return DIFFUSERS_NAMING if spec is None or spec.lora_naming is None else load(spec.lora_naming)


def lora_layers(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    """``model``'s layers a LoRA can wrap (Linear and convolution) with their names, peft wrappers seen through."""
    for name, module in model.named_modules():
        if isinstance(module, LORA_TARGET_TYPES) and ".lora_" not in name:
            yield name.removesuffix(".base_layer"), module


def lora_layer_names(model: torch.nn.Module) -> list[str]:
    """The names of ``model``'s layers a LoRA can wrap (Linear and convolution), peft wrappers seen through."""
    return [name for name, _ in lora_layers(model)]
