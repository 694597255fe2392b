"""Reading LoRA files in any layout of :mod:`.formats`, with layers named as the diffusers model names them.

A file's factors are grouped by the layer part of their keys (:data:`.formats.FACTOR_KEY`); each layer's name is
resolved to the diffusers module it names (the prefixes of :data:`.formats.STRIPPED_PREFIXES` stripped, native names
converted, kohya's underscores undone), or to a fused layer of the original release (FLUX.1's ``img_attn.qkv``), which
is then split into the diffusers layers it holds (:func:`.formats.split_fused`); its scale comes from the first of: a
per-layer ``alpha`` tensor, the folded scale the metadata records (divided out of ``lora_B`` again), peft's
``LoraConfig`` or plain ``lora_alpha`` entries. With :mod:`.formats`, this is the only module that spells LoRA keys.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..core.finite import require_finite
from .adapters import ADAPTER_KEY, DORA_PART, adapter_layer
from .formats import (
    DIFFUSERS_COMPONENT,
    FACTOR_KEY,
    FOLDED_SCALE_KEY,
    LAYOUT_KEY,
    LAYOUTS,
    MODEL_CLASS_KEY,
    STRIPPED_PREFIXES,
    UNDERSCORE_PREFIXES,
    AdapterLayer,
    LoRALayer,
    LoRAWeights,
    split_fused,
)
from .naming import FusedLayer, ModuleNaming, naming_for

_ALPHA_KEY = re.compile(r"^(?P<layer>.+)\.alpha$")


def read_file(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and metadata of a LoRA ``.safetensors`` file, with errors that name the file.

    Raises:
        FileNotFoundError: No such file.
        ValueError: Not safetensors (pickles are never read), or a damaged file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"LoRA file {str(path)!r} does not exist")
    if path.suffix != ".safetensors":
        raise ValueError(f"LoRA file {str(path)!r} is not .safetensors; only safetensors are read (no pickles): "
                         "convert it with the tool that wrote it, or pass the .safetensors export")
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            metadata = dict(handle.metadata() or {})
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 - not a dict
    except Exception as error:  # noqa: BLE001 - safetensors raises its own types for a damaged header or body
        raise ValueError(f"LoRA file {str(path)!r} is not a readable safetensors file ({error}); it may be truncated "
                         "(re-copy it) or a pickle renamed to .safetensors") from None
    return tensors, metadata


def read_lora(source: str | os.PathLike | Mapping[str, torch.Tensor], module_names: Collection[str] | None = None,
              naming: ModuleNaming | None = None, metadata: Mapping[str, str] | None = None,
              strict: bool = True) -> LoRAWeights:
    """Reads a LoRA in any supported layout, naming its layers as the diffusers model does.

    Args:
        source: A ``.safetensors`` file, or a state dict in memory.
        module_names: The model's LoRA-able layer names (diffusers names); needed to read kohya's underscored names,
            and to check that every layer matches a module. None trusts the names in the file.
        naming: The model's native naming, so native names (ComfyUI-style files) resolve to diffusers names; None
            takes the naming of the base model the file records (diffusers names when it records none).
        metadata: Entries that override the file's own (e.g. ``{"lora_alpha": "8"}`` for a file that lacks it).
        strict: Raise when some layers match no module (otherwise they are left out; ``unmatched`` lists them).

    Raises:
        ValueError: Not a LoRA, unknown keys, a non-finite weight, an incomplete layer, malformed metadata, or (with
            ``strict``) layers that match no module, each naming the file.
    """
    if isinstance(source, Mapping):
        bad = [key for key, value in source.items() if not isinstance(value, torch.Tensor)]
        if bad:
            raise ValueError(f"state dict values must be tensors; {bad[:5]} are not")
        tensors, file_metadata, where = dict(source), {}, "the given state dict"
    else:
        tensors, file_metadata = read_file(source)
        where = repr(str(source))
    file_metadata = {**file_metadata, **(metadata or {})}
    naming = naming or naming_for(file_metadata.get(MODEL_CLASS_KEY, ""))
    # A diverged run's file would merge NaN into every weight it touches (an all-black image).
    require_finite(tensors, f"LoRA {where} (written by a diverged run? use an earlier file)")
    groups, alphas, kinds = _group(tensors, where)
    resolver = _NameResolver(module_names, naming)
    layers, unmatched, prefixes, native_hits = {}, [], set(), 0
    for key_prefix, parts in groups.items():
        resolved = resolver.resolve(key_prefix)
        if resolved is None:
            unmatched.append(key_prefix)
            continue
        name, prefix, is_native = resolved
        if name in layers:
            raise ValueError(f"{where} holds two LoRAs for module {name!r}; keep one layout per file")
        prefixes.add(prefix)
        native_hits += is_native and not naming.identity
        layers[name] = _Pending(key_prefix, parts, alphas.get(key_prefix))
    if unmatched and (strict or not layers):
        examples = resolver.examples()
        raise ValueError(
            f"{len(unmatched)} of {len(groups)} LoRA layers in {where} match no Linear/Conv module of the model, "
            f"e.g. {unmatched[:5]}; its layers are named like {examples}. Load the LoRA into the model it was "
            "trained on" + ("; pass strict=False to skip them" if layers else ""))
    settings = _Settings.from_metadata(file_metadata, where)
    folded = _folded_scales(file_metadata, where)
    weights = {}
    for name, pending in layers.items():
        fused = resolver.fused_parts(name)
        if fused is None:
            weights[name] = pending.layer(name, naming.to_native(name) or name, settings, folded, where)
            continue
        spec, part_names = fused
        if set(pending.parts) != {"down", "up"}:
            raise ValueError(f"{where} holds a LoHa, LoKr or DoRA layer {pending.key_prefix!r} on "
                             f"{naming.fused.name}'s fused layer {name!r}, which is not split here; use a file of "
                             "the diffusers layers (the universal layout)")
        try:
            parts = split_fused(pending.layer(name, name, settings, folded, where), spec)
        except ValueError as error:
            raise ValueError(f"LoRA layer {pending.key_prefix!r} in {where} does not fit {naming.fused.name}'s "
                             f"{name!r}: {error}; load the LoRA into the model it was trained on") from None
        for part_name, part in zip(part_names, parts):
            if part_name in layers or part_name in weights:
                raise ValueError(f"{where} holds two LoRAs for module {part_name!r} (one in {name!r}); keep one "
                                 "layout per file")
            if part is not None:
                weights[part_name] = part
    layout = _layout_name(prefixes, kinds, bool(alphas), file_metadata, native_hits)
    return LoRAWeights(weights, layout, file_metadata, where, unmatched)


def _group(tensors: Mapping[str, torch.Tensor], where: str
           ) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, float], set[str]]:
    """``(factors per key prefix, alpha per key prefix, kinds of keys seen: "kohya" and/or "adapter")``."""
    groups: dict[str, dict[str, torch.Tensor]] = {}
    alphas: dict[str, float] = {}
    unknown, adapters, kinds = [], set(), set()
    for key, tensor in tensors.items():
        match = FACTOR_KEY.match(key)
        lycoris = None if match else ADAPTER_KEY.match(key)
        if lycoris:
            if lycoris["adapter"]:
                adapters.add(lycoris["adapter"])
            layer = groups.setdefault(lycoris["layer"], {})
            if lycoris["part"] in layer:
                raise ValueError(f"LoRA layer {lycoris['layer']!r} in {where} has two {lycoris['part']} weights")
            layer[lycoris["part"]] = tensor
        elif match:
            if match["adapter"]:
                adapters.add(match["adapter"])
            part = "down" if match["part"] in ("lora_A", "lora_down") else "up"
            if match["part"] in ("lora_down", "lora_up"):
                kinds.add("kohya")
            layer = groups.setdefault(match["layer"], {})
            if part in layer:
                raise ValueError(f"LoRA layer {match['layer']!r} in {where} has two {part} weights; keep one layout")
            layer[part] = tensor
        elif _ALPHA_KEY.match(key) and tensor.numel() == 1:
            alphas[_ALPHA_KEY.match(key)["layer"]] = float(tensor)
        else:
            unknown.append(key)
    if unknown:
        hint = "" if groups else "; is this a LoRA file?"
        raise ValueError(f"{where} holds keys that are not LoRA, DoRA (dora_scale), LoHa or LoKr weights (peft's "
                         "lora_magnitude_vector, biases, other adapters, LyCORIS's Tucker factors): "
                         f"{unknown[:5]}{hint}")
    if len(adapters) > 1:
        raise ValueError(f"{where} holds several adapters {sorted(adapters)}; pass a file with only one")
    incomplete = [name for name, parts in groups.items()
                  if not {"down", "up"} <= set(parts) and not set(parts).isdisjoint({"down", "up", DORA_PART})]
    if incomplete:
        raise ValueError(f"LoRA layers in {where} lack their down (A) or up (B) weight: {incomplete[:5]}")
    if not groups:
        raise ValueError(f"{where} holds no LoRA weights")
    stray = sorted(set(alphas) - set(groups))
    if stray:
        raise ValueError(f"{where} has alpha entries for layers without weights: {stray[:5]}")
    if adapters:
        kinds.add("adapter")
    return groups, alphas, kinds


class _NameResolver:
    """Finds the diffusers module a key prefix names, through prefixes, native names and kohya's underscores."""

    def __init__(self, module_names: Collection[str] | None, naming: ModuleNaming) -> None:
        self.modules = set(module_names) if module_names is not None else None
        self.naming = naming
        self.underscored: dict[str, str] = {}
        for name in self.modules or ():
            self.underscored[name.replace(".", "_")] = name
            native = naming.to_native(name)
            if native is not None:
                self.underscored.setdefault(native.replace(".", "_"), name)

    def examples(self) -> list[str]:
        if not self.modules:
            return []
        return [self.naming.to_native(name) or name for name in sorted(self.modules)[:6]]

    def fused_parts(self, name: str) -> tuple[FusedLayer, list[str]] | None:
        """The fused layer of the original release that ``name`` denotes and its diffusers layers, when the naming
        has one by that name whose layers the model all has; None for any other name."""
        if self.naming.fused is None or (self.modules is not None and name in self.modules):
            return None
        fused = self.naming.fused.parts(name)
        # A one-part layer under its diffusers name (Ideogram 4's feed_forward.w1) is that layer, not a fused one.
        if fused is None or fused[1] == [name] or (self.modules is not None and not set(fused[1]) <= self.modules):
            return None
        return fused

    def _lookup(self, name: str) -> tuple[str, bool] | None:
        """``(diffusers name or fused layer, whether the file used the native name)`` of a prefix-free name."""
        if self.fused_parts(name) is not None:
            return name, True
        if self.modules is None:
            converted = self.naming.to_diffusers(name)
            return (name, False) if converted is None or converted == name else (converted, True)
        if name in self.modules:
            return name, self.naming.identity
        converted = self.naming.to_diffusers(name)
        if converted is not None and converted in self.modules:
            return converted, True
        return None

    def resolve(self, key_prefix: str) -> tuple[str, str, bool] | None:
        for prefix in UNDERSCORE_PREFIXES:
            if key_prefix.startswith(prefix):
                stem = key_prefix[len(prefix):]
                name = self.underscored.get(stem)
                if name is None and self.naming.fused is not None:
                    name = self.naming.fused.from_underscored(stem)
                    name = name if name is not None and self.fused_parts(name) is not None else None
                return None if name is None else (name, prefix, True)
        name, stripped = key_prefix, ""
        while True:
            found = self._lookup(name)
            if found is not None and (self.modules is not None or not name.startswith(STRIPPED_PREFIXES)):
                return found[0], stripped, found[1]
            known = next((prefix for prefix in STRIPPED_PREFIXES if name.startswith(prefix)), None)
            if known is None:
                return None
            name, stripped = name[len(known):], stripped + known


@dataclass
class _Settings:
    """The scale rule of a file's metadata: peft's ``LoraConfig`` fields or plain entries."""

    lora_alpha: float | None = None
    alpha_pattern: Mapping[str, float] = field(default_factory=dict)
    use_rslora: bool = False
    rank: int | None = None

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str], where: str) -> _Settings:
        config: dict = {}
        raw = metadata.get("lora_adapter_metadata")
        if raw:
            try:
                entries = json.loads(raw)
            except json.JSONDecodeError as error:
                raise ValueError(f"lora_adapter_metadata in {where} is not JSON ({error}); remove or fix it") from None
            # diffusers writes the config of each pipeline component under "<component>." keys.
            groups: dict[str | None, dict] = {}
            for key, value in entries.items():
                head, _, tail = key.rpartition(".")
                groups.setdefault(head or None, {})[tail] = value
            if DIFFUSERS_COMPONENT in groups or None in groups:
                config = groups.get(DIFFUSERS_COMPONENT, groups.get(None))
            elif len(groups) == 1:
                config = next(iter(groups.values()))
            else:
                raise ValueError(f"lora_adapter_metadata in {where} describes components {sorted(map(str, groups))}, "
                                 f"none of them {DIFFUSERS_COMPONENT!r}; pass metadata= with the right lora_alpha")
        # Plain entries (this project's first file format, or a caller's override) win over the JSON.
        config.update({key: metadata[key] for key in ("lora_alpha", "rank", "r") if key in metadata})
        try:
            alpha = config.get("lora_alpha")
            rank = config.get("rank", config.get("r")) if not config.get("rank_pattern") else None
            return cls(lora_alpha=None if alpha is None else float(alpha),
                       alpha_pattern={key: float(value) for key, value in (config.get("alpha_pattern") or {}).items()},
                       use_rslora=str(config.get("use_rslora", False)).lower() == "true",
                       rank=None if rank is None else int(rank))
        except (TypeError, ValueError) as error:
            raise ValueError(f"LoRA metadata in {where} has a malformed alpha or rank ({error}): {config}") from None

    def scale(self, name: str, rank: int) -> float:
        alpha = self.lora_alpha
        for pattern, value in self.alpha_pattern.items():
            if re.fullmatch(rf"(.*\.)?{pattern}", name):
                alpha = value
                break
        if alpha is None:
            return 1.0
        return alpha / (math.sqrt(rank) if self.use_rslora else rank)


def _folded_scales(metadata: Mapping[str, str], where: str) -> Callable[[str], float | None]:
    raw = metadata.get(FOLDED_SCALE_KEY)
    if raw is None:
        return lambda native: None
    try:
        value = json.loads(raw)
        if isinstance(value, (int, float)):
            return lambda native: float(value)
        table = {str(key): float(item) for key, item in value.items()}
    except (ValueError, TypeError, AttributeError) as error:
        raise ValueError(f"{FOLDED_SCALE_KEY} in {where} is malformed ({raw!r}: {error}); remove the entry (the "
                         "file then loads at the strength its tensors hold)") from None
    return table.get


@dataclass
class _Pending:
    key_prefix: str
    parts: dict[str, torch.Tensor]
    alpha: float | None

    def layer(self, name: str, native: str, settings: _Settings, folded: Callable[[str], float | None],
              where: str) -> AdapterLayer:
        if "down" not in self.parts:
            return adapter_layer(self.parts, self.alpha, f"{self.key_prefix!r} in {where}")
        layer = self._lora(name, native, settings, folded, where)
        dora_scale = self.parts.get(DORA_PART)
        if dora_scale is not None:
            if dora_scale.shape[0] != layer.up.shape[0] or dora_scale.numel() != layer.up.shape[0]:
                raise ValueError(f"DoRA layer {self.key_prefix!r} in {where} has a dora_scale of shape "
                                 f"{tuple(dora_scale.shape)}; only one entry per output row ({layer.up.shape[0]}) is "
                                 "read (LyCORIS's input-axis decomposition is not)")
            layer.dora_scale = dora_scale.float().flatten()
        return layer

    def _lora(self, name: str, native: str, settings: _Settings, folded: Callable[[str], float | None],
              where: str) -> LoRALayer:
        down, up = self.parts["down"], self.parts["up"]
        rank = down.shape[0]
        if self.alpha is not None:  # every tool reads a per-layer alpha first
            return LoRALayer(down, up, self.alpha / rank)
        folded_scale = folded(native)
        folded_scale = folded(name) if folded_scale is None else folded_scale
        if folded_scale is not None:
            if folded_scale == 0 or not math.isfinite(folded_scale):
                raise ValueError(f"{FOLDED_SCALE_KEY} of layer {native!r} in {where} is {folded_scale}; it must be a "
                                 "non-zero finite number")
            # The file's factors hold the scale already; dividing it out restores the trained factors.
            return LoRALayer(down, up.float() / folded_scale, folded_scale)
        if settings.rank is not None and settings.rank != rank:
            raise ValueError(f"LoRA layer {self.key_prefix!r} in {where} has rank {rank} but the metadata says rank "
                             f"{settings.rank}; fix the metadata or pass metadata= with the right rank")
        return LoRALayer(down, up, settings.scale(name, rank))


def _layout_name(prefixes: set[str], kinds: set[str], has_alpha: bool, metadata: Mapping[str, str],
                 native_hits: int) -> str:
    declared = metadata.get(LAYOUT_KEY)
    if declared in LAYOUTS:
        return declared
    if "kohya" in kinds or any(prefix in UNDERSCORE_PREFIXES for prefix in prefixes):
        return "kohya"
    if "adapter" in kinds:
        return "peft"
    if "diffusion_model." in prefixes:
        return "universal"
    if "lora_rank" in metadata and "lora_adapter_metadata" in metadata:
        return "diffsynth-v1"
    return "diffusers" if native_hits == 0 and not has_alpha else "other"
