"""Merging a LoRA file into a module's weights (``W += strength * scale * up @ down``), for any ``torch.nn.Module``.

Merging costs nothing at inference time and needs no peft wrapper, but cannot be undone except by reloading the
weights; use peft's adapters instead where LoRAs are switched at run time. Every layout of :mod:`.formats` is read,
with the scale the file declares (folded, per-layer alphas, or diffusers' metadata), so strength 1.0 is the strength
the LoRA was trained at. Linear, Conv1d, Conv2d and Conv3d targets are supported.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping

import torch

from ..core.quant import dense_weight, repack_4bit_weight, weight_shape
from .formats import AdapterLayer, LoRALayer, LoRAWeights
from .naming import LORA_TARGET_TYPES, ModuleNaming, naming_for
from .reading import read_lora

logger = logging.getLogger(__name__)


def load_lora(
    module: torch.nn.Module,
    path_or_state_dict: str | os.PathLike | Mapping[str, torch.Tensor],
    alpha: float = 1.0,
    *,
    metadata: Mapping[str, str] | None = None,
    strict: bool = True,
    naming: ModuleNaming | None = None,
) -> int:
    """Merges a LoRA into ``module``'s weights in place, keeping each weight's dtype and device.

    Every layer is checked before any weight changes, so an error leaves the module as it was.

    Args:
        module: The model the LoRA was trained on (e.g. a pipeline's ``dit``).
        path_or_state_dict: A ``.safetensors`` file, or a state dict already in memory.
        alpha: Strength multiplier on top of the file's own scale; 0.5 adds half the delta.
        metadata: Extra safetensors-style metadata; entries override the file's own.
        strict: Raise if some LoRA layers match no module; with False they are skipped with a warning.
        naming: The model's original-release naming; None picks it from the model's class.

    Returns:
        The number of layers whose weights were updated.

    Raises:
        FileNotFoundError: The file does not exist.
        ValueError: The file is not a readable safetensors LoRA, holds non-finite values or unknown keys, matches no
            module (or, with ``strict``, not all of them), or a layer's shapes do not fit its module.
    """
    if not math.isfinite(alpha):
        raise ValueError(f"alpha={alpha} must be a finite number, e.g. 1.0")
    weights, targets = _fitting_layers(module, path_or_state_dict, metadata, strict, naming)
    # Deltas are built one at a time: all of them at once would take the model's size again, in float32.
    with torch.no_grad():
        for name, layer in weights.layers.items():
            target = targets[name]
            weight = dense_weight(target)
            delta = layer.delta(device=weight.device, base=weight)
            merged = (weight.to(torch.float32) + alpha * delta.reshape(weight.shape)).to(weight.dtype)
            if weight is target.weight:
                weight.copy_(merged)
            else:  # a packed 4-bit weight (an NF4 release), packed again
                repack_4bit_weight(target, merged)
    return len(weights.layers)


def check_lora(module: torch.nn.Module, path_or_state_dict: str | os.PathLike | Mapping[str, torch.Tensor],
               *, strict: bool = True, naming: ModuleNaming | None = None) -> int:
    """Checks that :func:`load_lora` would merge the LoRA into ``module``, without changing anything.

    Only names and shapes are compared, so ``module`` may be a skeleton built on the meta device: a trainer checks a
    LoRA against a 20B-parameter model before loading its weights.

    Returns:
        The number of layers the merge would update.

    Raises:
        FileNotFoundError, ValueError: As :func:`load_lora`.
    """
    return len(_fitting_layers(module, path_or_state_dict, None, strict, naming, allow_meta=True)[0].layers)


def _fitting_layers(module: torch.nn.Module, source: str | os.PathLike | Mapping[str, torch.Tensor],
                    metadata: Mapping[str, str] | None, strict: bool, naming: ModuleNaming | None,
                    allow_meta: bool = False) -> tuple[LoRAWeights, dict[str, torch.nn.Module]]:
    """The LoRA's layers, each checked to fit its module of ``module``, and those modules by name."""
    targets = {name: sub for name, sub in module.named_modules() if isinstance(sub, LORA_TARGET_TYPES)}
    weights = read_lora(source, targets, naming or naming_for(module), metadata, strict)
    if weights.unmatched:
        logger.warning("Skipping %d unmatched LoRA layers from %s, e.g. %s", len(weights.unmatched), weights.source,
                       weights.unmatched[:5])
    for name, layer in weights.layers.items():
        if targets[name].weight.is_meta and not allow_meta:
            raise ValueError(f"module {name!r} has its weight on the meta device; load the base weights before the "
                             "LoRA")
        _check_fits(name, layer, tuple(weight_shape(targets[name])), weights.source)
    return weights, targets


def _check_fits(name: str, layer: AdapterLayer, shape: tuple[int, ...], source: str) -> None:
    """Raises unless the layer's change has the weight's ``shape``: ``up @ down`` for a LoRA (a conv delta keeps
    down's kernel, up being 1 x 1), the factors' product for LoHa and LoKr (Linear layers)."""
    if not isinstance(layer, LoRALayer):
        if tuple(layer.shape) != shape:
            raise ValueError(f"{layer.kind} layer {name!r} in {source} makes a change of shape {tuple(layer.shape)}, "
                             f"module {name!r} has weight {shape}; was it trained on another model?")
        return
    down, up = layer.down, layer.up
    fits = up.dim() == down.dim() >= 2 and up.shape[1] == down.shape[0] and all(size == 1 for size in up.shape[2:])
    if not fits or (up.shape[0], *down.shape[1:]) != shape:
        raise ValueError(
            f"LoRA layer {name!r} in {source} (down {tuple(down.shape)}, up {tuple(up.shape)}) does not fit "
            f"module {name!r} with weight {shape}; was it trained on another model?"
        )
