"""Merging a LoRA file into a module's weights (``W += alpha * scale * B @ A``), for any ``torch.nn.Module``.

Merging costs nothing at inference time and needs no peft wrapper, but cannot be undone except by reloading the
weights; use peft's adapters instead where LoRAs are switched at run time.

Accepted key layouts, per layer ``<prefix>`` (the module's name, possibly behind one or more of
:data:`STRIPPED_PREFIXES`):

* peft / diffusers: ``<prefix>.lora_A.weight`` and ``<prefix>.lora_B.weight``, or with an adapter name,
  ``<prefix>.lora_A.<adapter>.weight``;
* kohya: ``<prefix>.lora_down.weight`` and ``<prefix>.lora_up.weight``, with an optional ``<prefix>.alpha`` scalar.

The per-layer ``scale`` is, first found wins: the kohya ``alpha`` tensor divided by the layer's rank; else, from the
safetensors metadata, diffusers' ``lora_adapter_metadata`` JSON (peft's ``LoraConfig``: ``lora_alpha``,
``alpha_pattern``, ``use_rslora``, possibly under a component prefix such as ``transformer.``) or a plain
``lora_alpha`` entry, divided by the rank; else 1 (alpha equal to rank, the peft and diffusers convention for files
without alphas). The rank always comes from the tensors; a metadata ``rank`` or ``r`` only has to agree with them.
Linear, Conv1d, Conv2d and Conv3d targets are supported (a conv LoRA is a ``k x k`` down conv and a ``1 x 1`` up conv).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

STRIPPED_PREFIXES = ("transformer.", "diffusion_model.", "base_model.model.", "pipe.dit.", "model.")
_TARGET_TYPES = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
_PEFT_KEY = re.compile(r"^(?P<layer>.+)\.lora_(?P<part>A|B)(?:\.(?P<adapter>[^.]+))?\.weight$")
_KOHYA_KEY = re.compile(r"^(?P<layer>.+)\.lora_(?P<part>down|up)\.weight$")
_ALPHA_KEY = re.compile(r"^(?P<layer>.+)\.alpha$")


@dataclass
class _Layer:
    down: torch.Tensor | None = None
    up: torch.Tensor | None = None
    alpha: float | None = None


def load_lora(
    module: torch.nn.Module,
    path_or_state_dict: str | os.PathLike | Mapping[str, torch.Tensor],
    alpha: float = 1.0,
    *,
    metadata: Mapping[str, str] | None = None,
    strict: bool = True,
) -> int:
    """Merges a LoRA into ``module``'s weights in place, keeping each weight's dtype and device.

    Every layer is checked before any weight changes, so an error leaves the module as it was.

    Args:
        module: The model the LoRA was trained on (e.g. a pipeline's ``dit``).
        path_or_state_dict: A ``.safetensors`` file, or a state dict already in memory.
        alpha: Strength multiplier on top of the file's own scale; 0.5 adds half the delta.
        metadata: Extra safetensors-style metadata; entries override the file's own.
        strict: Raise if some LoRA layers match no module; with False they are skipped with a warning.

    Returns:
        The number of layers whose weights were updated.

    Raises:
        FileNotFoundError: The file does not exist.
        ValueError: The file is not safetensors, holds no LoRA keys or unknown ones, matches no module (or, with
            ``strict``, not all of them), or a layer's shapes do not fit its module.
    """
    if not math.isfinite(alpha):
        raise ValueError(f"alpha={alpha} must be a finite number, e.g. 1.0")
    state_dict, file_metadata, source = _read(path_or_state_dict)
    file_metadata.update(metadata or {})
    layers = _group_layers(state_dict, source)
    targets = {name: sub for name, sub in module.named_modules() if isinstance(sub, _TARGET_TYPES)}
    resolved: dict[str, tuple[str, _Layer]] = {}
    unmatched: list[str] = []
    component = None
    for key_prefix, layer in layers.items():
        match = _resolve(key_prefix, targets)
        if match is None:
            unmatched.append(key_prefix)
            continue
        resolved[key_prefix] = match[0], layer
        # The first stripped prefix names the pipeline component, which selects diffusers' metadata group.
        first = next((prefix for prefix in STRIPPED_PREFIXES if match[1].startswith(prefix)), None)
        component = component or (first[:-1] if first else None)
    if unmatched and (strict or not resolved):
        raise ValueError(
            f"{len(unmatched)} of {len(layers)} LoRA layers in {source} match no Linear/Conv module of "
            f"{type(module).__name__}, e.g. {unmatched[:5]}; its modules are named like {list(targets)[:8]}. Load "
            f"the LoRA into the model it was trained on, or rename the keys (prefixes {list(STRIPPED_PREFIXES)} "
            f"are stripped automatically)" + ("; pass strict=False to skip them" if resolved else "")
        )
    if unmatched:
        logger.warning("Skipping %d unmatched LoRA layers from %s, e.g. %s", len(unmatched), source, unmatched[:5])
    settings = _metadata_settings(file_metadata, component, source)

    plans = []
    for key_prefix, (name, layer) in resolved.items():
        weight = targets[name].weight
        _check_fits(key_prefix, name, layer, weight, source)
        plans.append((weight, layer, alpha * _layer_scale(key_prefix, name, layer, settings, source)))
    # Deltas are built one at a time: all of them at once would take the model's size again, in float32.
    with torch.no_grad():
        for weight, layer, factor in plans:
            down = layer.down.to(device=weight.device, dtype=torch.float32)
            up = layer.up.to(device=weight.device, dtype=torch.float32)
            merged = weight.to(torch.float32) + factor * (up.flatten(1) @ down.flatten(1)).reshape(weight.shape)
            weight.copy_(merged.to(weight.dtype))
    return len(plans)


def _read(source: str | os.PathLike | Mapping[str, torch.Tensor]) -> tuple[dict, dict[str, str], str]:
    if isinstance(source, Mapping):
        bad = [key for key, value in source.items() if not isinstance(value, torch.Tensor)]
        if bad:
            raise ValueError(f"state dict values must be tensors; {bad[:5]} are not")
        return dict(source), {}, "the given state dict"
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"LoRA file {str(path)!r} does not exist")
    if path.suffix != ".safetensors":
        raise ValueError(f"LoRA file {str(path)!r} is not .safetensors; only safetensors are read (no pickles)")
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            metadata = dict(handle.metadata() or {})
            state_dict = {key: handle.get_tensor(key) for key in handle.keys()}
    except Exception as error:  # safetensors raises its own error types for a damaged header
        raise ValueError(f"LoRA file {str(path)!r} is not a readable safetensors file: {error}") from None
    return state_dict, metadata, repr(str(path))


def _group_layers(state_dict: Mapping[str, torch.Tensor], source: str) -> dict[str, _Layer]:
    layers: dict[str, _Layer] = {}
    unknown, adapters = [], set()
    for key, tensor in state_dict.items():
        match = _PEFT_KEY.match(key) or _KOHYA_KEY.match(key)
        if match:
            if match.groupdict().get("adapter"):
                adapters.add(match["adapter"])
            layer = layers.setdefault(match["layer"], _Layer())
            part = "down" if match["part"] in ("A", "down") else "up"
            if getattr(layer, part) is not None:
                raise ValueError(f"LoRA layer {match['layer']!r} in {source} has two {part} weights; keep one format")
            setattr(layer, part, tensor)
        elif _ALPHA_KEY.match(key) and tensor.numel() == 1:
            layers.setdefault(_ALPHA_KEY.match(key)["layer"], _Layer()).alpha = float(tensor)
        else:
            unknown.append(key)
    if unknown:
        hint = "" if layers else "; is this a LoRA file?"
        raise ValueError(
            f"{source} holds keys that are not plain LoRA weights (DoRA, biases, other adapters): {unknown[:5]}{hint}"
        )
    if len(adapters) > 1:
        raise ValueError(f"{source} holds several adapters {sorted(adapters)}; pass a state dict with only one")
    incomplete = [name for name, layer in layers.items() if layer.down is None or layer.up is None]
    if incomplete:
        raise ValueError(f"LoRA layers in {source} lack their down (A) or up (B) weight: {incomplete[:5]}")
    if not layers:
        raise ValueError(f"{source} holds no LoRA weights")
    return layers


def _resolve(key_prefix: str, targets: Mapping[str, torch.nn.Module]) -> tuple[str, str] | None:
    """The module name a key prefix refers to, and the prefix stripped to get there (tried before stripping)."""
    name, stripped = key_prefix, ""
    while name not in targets:
        known = next((prefix for prefix in STRIPPED_PREFIXES if name.startswith(prefix)), None)
        if known is None:
            return None
        name, stripped = name[len(known):], stripped + known
    return name, stripped


@dataclass
class _Settings:
    lora_alpha: float | None = None
    alpha_pattern: Mapping[str, float] | None = None
    use_rslora: bool = False
    rank: int | None = None


def _metadata_settings(metadata: Mapping[str, str], component: str | None, source: str) -> _Settings:
    config: dict = {}
    raw = metadata.get("lora_adapter_metadata")
    if raw:
        try:
            entries = json.loads(raw)
        except json.JSONDecodeError as error:
            raise ValueError(f"lora_adapter_metadata in {source} is not JSON ({error}); remove or fix it") from None
        # diffusers writes the config of each pipeline component under "<component>." keys.
        groups: dict[str | None, dict] = {}
        for key, value in entries.items():
            head, _, tail = key.rpartition(".")
            groups.setdefault(head or None, {})[tail] = value
        if component in groups or None in groups:
            config = groups.get(component, groups.get(None))
        elif len(groups) == 1:
            config = next(iter(groups.values()))
        else:
            raise ValueError(
                f"lora_adapter_metadata in {source} describes components {sorted(map(str, groups))}, none of them "
                f"{component!r}; pass metadata= with the right lora_alpha"
            )
    # Plain entries win over the JSON, so metadata= can correct a file's config.
    config.update({key: metadata[key] for key in ("lora_alpha", "rank", "r") if key in metadata})
    try:
        alpha = config.get("lora_alpha")
        rank = config.get("rank", config.get("r")) if not config.get("rank_pattern") else None
        return _Settings(
            lora_alpha=None if alpha is None else float(alpha),
            alpha_pattern={key: float(value) for key, value in (config.get("alpha_pattern") or {}).items()},
            use_rslora=str(config.get("use_rslora", False)).lower() == "true",
            rank=None if rank is None else int(rank),
        )
    except (TypeError, ValueError) as error:
        raise ValueError(f"LoRA metadata in {source} has a malformed alpha or rank ({error}): {config}") from None


def _layer_scale(key_prefix: str, name: str, layer: _Layer, settings: _Settings, source: str) -> float:
    rank = layer.down.shape[0]
    if layer.alpha is not None:
        return layer.alpha / rank
    if settings.rank is not None and settings.rank != rank:
        raise ValueError(
            f"LoRA layer {key_prefix!r} in {source} has rank {rank} but the metadata says rank {settings.rank}; "
            f"fix the metadata or pass metadata= with the right rank"
        )
    alpha = settings.lora_alpha
    for pattern, value in (settings.alpha_pattern or {}).items():
        if re.fullmatch(rf"(.*\.)?{pattern}", name):
            alpha = value
            break
    if alpha is None:
        return 1.0
    return alpha / (math.sqrt(rank) if settings.use_rslora else rank)


def _check_fits(key_prefix: str, name: str, layer: _Layer, weight: torch.Tensor, source: str) -> None:
    """Raises unless ``B @ A`` (a conv delta keeps A's kernel, B being 1 x 1) has the weight's shape."""
    down, up = layer.down, layer.up
    if weight.is_meta:
        raise ValueError(f"module {name!r} has its weight on the meta device; load the base weights before the LoRA")
    fits = up.dim() == down.dim() >= 2 and up.shape[1] == down.shape[0] and all(size == 1 for size in up.shape[2:])
    if not fits or (up.shape[0], *down.shape[1:]) != tuple(weight.shape):
        raise ValueError(
            f"LoRA layer {key_prefix!r} in {source} (down {tuple(down.shape)}, up {tuple(up.shape)}) does not fit "
            f"module {name!r} with weight {tuple(weight.shape)}; was it trained on another model?"
        )
