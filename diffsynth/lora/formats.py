"""The LoRA file layouts: the one place that spells LoRA keys, for writing, reading and converting.

A LoRA is a set of layers, each ``delta W = scale * up @ down`` on one module of the model (``down`` is peft's
``lora_A``, kohya's ``lora_down``). Files differ in how they name the module, the two factors and the scale:

========== ================================================== ===================================================
layout     keys of one layer                                  scale
========== ================================================== ===================================================
universal  ``diffusion_model.<native>.lora_A.weight``,        folded into ``lora_B`` (the file's strength is 1.0)
           ``...lora_B.weight``
diffusers  ``transformer.<diffusers name>.lora_A.weight``     ``lora_adapter_metadata`` (peft ``LoraConfig`` JSON)
kohya      ``lora_unet_<native with _>.lora_down.weight``,    ``<...>.alpha`` tensor divided by the rank
           ``...lora_up.weight``, ``...alpha``
peft       ``<native>.lora_A.default.weight``                 folded (the reference's training output)
========== ================================================== ===================================================

``<native>`` is the layer's name in the model's original release (:mod:`.naming`): ComfyUI, DiffSynth-Studio and
musubi-tuner run that code. The trainer writes ``universal``, the one layout that diffusers, ComfyUI, DiffSynth-Studio
and musubi-tuner all load fully at strength 1.0 (checked by ``python -m diffsynth.lora inspect``).

Reading accepts all four, plus this project's earlier files (diffusers layout with a plain ``lora_alpha`` entry), any
of the prefixes in :data:`STRIPPED_PREFIXES`, and diffusers' or native names. A scale folded into ``lora_B`` is
recorded in the metadata (``diffsynth.lora.folded_scale``) and unfolded on reading, so a file read back holds the
factors that were trained, and is never scaled twice.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..core.files import atomic_save_safetensors
from ..core.finite import require_finite
from .naming import DIFFUSERS_NAMING, ModuleNaming, naming_for

LAYOUTS = ("universal", "diffusers", "kohya", "peft")
FORMAT_VERSION = 2
# Prefixes tools put before module names; stripped one after another until a module matches.
STRIPPED_PREFIXES = ("transformer.", "diffusion_model.", "base_model.model.", "pipe.dit.", "model.", "unet.")
UNDERSCORE_PREFIXES = ("lora_unet_", "lora_transformer_", "lycoris_")
DIFFUSERS_COMPONENT = "transformer"
FOLDED_SCALE_KEY = "diffsynth.lora.folded_scale"
MODEL_CLASS_KEY = "diffsynth.lora.base_model_class"
MODEL_CONFIG_KEY = "diffsynth.lora.base_model_config"
_META = "diffsynth.lora."
_FACTOR_KEY = re.compile(r"^(?P<layer>.+?)\.(?P<part>lora_A|lora_B|lora_down|lora_up)(?:\.(?P<adapter>[^.]+))?"
                         r"\.weight$")
_ALPHA_KEY = re.compile(r"^(?P<layer>.+)\.alpha$")


@dataclass
class LoRALayer:
    """One layer of a LoRA: ``delta W = scale * up @ down`` (a conv ``down`` keeps its kernel, ``up`` is 1x1)."""

    down: torch.Tensor
    up: torch.Tensor
    scale: float = 1.0

    @property
    def rank(self) -> int:
        return self.down.shape[0]

    def delta(self, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> torch.Tensor:
        """The weight change, shaped like the module's weight, computed in ``dtype`` on ``device``."""
        product = self.up.to(device, dtype).flatten(1) @ self.down.to(device, dtype).flatten(1)
        return self.scale * product.reshape(self.up.shape[0], *self.down.shape[1:])


@dataclass
class LoRAWeights:
    """A LoRA read from a file or built from trained weights, with layers keyed by diffusers module name.

    Attributes:
        layers: ``{module name relative to the model: LoRALayer}``.
        layout: The layout it was read in (one of :data:`LAYOUTS`, or ``"diffsynth-v1"`` for this project's earlier
            files), or None when built in memory.
        metadata: The file's safetensors metadata.
        source: How to name it in messages (the path).
    """

    layers: dict[str, LoRALayer]
    layout: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    source: str = "the LoRA"
    unmatched: list[str] = field(default_factory=list)

    @property
    def ranks(self) -> set[int]:
        return {layer.rank for layer in self.layers.values()}

    @property
    def scales(self) -> set[float]:
        return {layer.scale for layer in self.layers.values()}

    def describe(self) -> dict[str, Any]:
        """Rank, alpha and targets as plain values (``None`` where the layers disagree)."""
        rank = next(iter(self.ranks)) if len(self.ranks) == 1 else None
        scale = next(iter(self.scales)) if len(self.scales) == 1 else None
        alpha = None if rank is None or scale is None else _plain_number(scale * rank)
        return {"rank": rank, "alpha": alpha, "scale": scale, "layers": len(self.layers),
                "targets": sorted({_suffix(name) for name in self.layers})}


def _suffix(name: str) -> str:
    """``blocks.3.attn1.to_q`` -> ``attn1.to_q``: the part of a layer name that repeats across blocks."""
    return re.sub(r"^(?:[a-z_]*blocks)\.\d+\.", "", name)


def _plain_number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def is_peft_lora_key(key: str) -> bool:
    """Whether ``key`` names a peft LoRA factor (``<module>.lora_A[.<adapter>].weight`` or ``lora_B``)."""
    match = _FACTOR_KEY.match(key)
    return match is not None and match["part"] in ("lora_A", "lora_B")


def from_peft_state_dict(state_dict: Mapping[str, torch.Tensor], alpha: float | None,
                         prefix: str = "") -> LoRAWeights:
    """The LoRA of a peft-injected model's trainable weights (``<module>.lora_A.<adapter>.weight`` keys).

    Args:
        state_dict: The LoRA weights, e.g. ``pipe.dit.blocks.0.attn1.to_q.lora_A.default.weight``.
        alpha: peft's ``lora_alpha``: each layer's scale is ``alpha / rank``; None means alpha equal to the rank.
        prefix: Removed from each key first (``pipe.dit.``), leaving names relative to the model.

    Raises:
        ValueError: A key is no LoRA weight, several adapters are mixed, or a layer lacks one factor.
    """
    factors, adapters = {}, set()
    for key, tensor in state_dict.items():
        match = _FACTOR_KEY.match(key.removeprefix(prefix))
        if match is None or match["part"] not in ("lora_A", "lora_B"):
            raise ValueError(f"{key!r} is not a peft LoRA weight; save full weights with save_state_dict, or train "
                             "only the LoRA (drop --trainable_models)")
        adapters.add(match["adapter"])
        factors.setdefault(match["layer"], {})[match["part"]] = tensor
    if len(adapters) > 1:
        raise ValueError(f"the state dict mixes peft adapters {sorted(map(str, adapters))}; pass one adapter")
    incomplete = sorted(name for name, parts in factors.items() if len(parts) != 2)
    if incomplete:
        raise ValueError(f"LoRA layers {incomplete[:5]} lack their lora_A or lora_B weight; pass the whole adapter")
    if not factors:
        raise ValueError("the state dict holds no LoRA weight; is a LoRA injected (--lora_base_model)?")
    layers = {}
    for name, parts in factors.items():
        rank = parts["lora_A"].shape[0]
        layers[name] = LoRALayer(parts["lora_A"], parts["lora_B"], 1.0 if alpha is None else alpha / rank)
    return LoRAWeights(layers)


# ---- writing ---------------------------------------------------------------------------------------------------


def to_state_dict(weights: LoRAWeights, layout: str, naming: ModuleNaming = DIFFUSERS_NAMING,
                  dtype: torch.dtype | None = None) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and layout-specific metadata entries of ``weights`` written in ``layout``.

    Args:
        weights: The LoRA, layers keyed by diffusers module name.
        layout: One of :data:`LAYOUTS`.
        naming: The model's native naming (universal, kohya and peft name layers natively).
        dtype: Storage dtype of the factors; None keeps theirs. Folding happens in float32 first.

    Raises:
        ValueError: Unknown layout, or a layer the native naming has no name for.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown LoRA layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    uniform = len(weights.ranks) == 1 and len(weights.scales) == 1
    fold = layout in ("universal", "peft") or (layout == "diffusers" and not uniform)
    tensors, metadata, folded = {}, {}, {}

    def store(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().to("cpu", dtype or tensor.dtype).contiguous()

    for name, layer in sorted(weights.layers.items()):
        native = naming.to_native(name)
        if native is None and layout != "diffusers":
            raise ValueError(f"LoRA layer {name!r} has no name in the {naming.name} code, so a {layout} file cannot "
                             "name it; leave it out of --lora_target_modules, or write the diffusers layout")
        up, down = layer.up, layer.down
        if fold:
            up = layer.up.float() * layer.scale
            folded[native if layout != "diffusers" else name] = layer.scale
        if layout == "universal":
            tensors[f"diffusion_model.{native}.lora_A.weight"] = store(down)
            tensors[f"diffusion_model.{native}.lora_B.weight"] = store(up)
        elif layout == "peft":
            tensors[f"{native}.lora_A.default.weight"] = store(down)
            tensors[f"{native}.lora_B.default.weight"] = store(up)
        elif layout == "kohya":
            stem = "lora_unet_" + native.replace(".", "_")
            tensors[f"{stem}.lora_down.weight"] = store(down)
            tensors[f"{stem}.lora_up.weight"] = store(up)
            tensors[f"{stem}.alpha"] = torch.tensor(float(layer.scale * layer.rank))
        else:
            tensors[f"{DIFFUSERS_COMPONENT}.{name}.lora_A.weight"] = store(down)
            tensors[f"{DIFFUSERS_COMPONENT}.{name}.lora_B.weight"] = store(up)
    if layout == "diffusers" and uniform:
        rank, scale = next(iter(weights.ranks)), next(iter(weights.scales))
        config = {"r": rank, "lora_alpha": _plain_number(scale * rank), "target_modules": sorted(weights.layers)}
        metadata["lora_adapter_metadata"] = json.dumps({f"{DIFFUSERS_COMPONENT}.{key}": value
                                                        for key, value in config.items()}, sort_keys=True)
    if folded:
        values = set(folded.values())
        metadata[FOLDED_SCALE_KEY] = (repr(float(next(iter(values)))) if len(values) == 1
                                      else json.dumps(folded, sort_keys=True))
    metadata[_META + "layout"] = layout
    metadata[_META + "format_version"] = str(FORMAT_VERSION)
    return tensors, metadata


def describe_metadata(weights: LoRAWeights, naming: ModuleNaming) -> dict[str, str]:
    """The entries that say what a LoRA is: rank, the alpha its strength 1.0 corresponds to, targets, naming."""
    info = weights.describe()
    entries = {_META + "layers": str(info["layers"]), _META + "targets": ",".join(info["targets"]),
               _META + "native_naming": naming.name}
    if info["rank"] is not None:
        entries["lora_rank"] = str(info["rank"])
    if info["alpha"] is not None:
        entries[_META + "alpha"] = str(info["alpha"])
    return entries


def write_lora(path: str | os.PathLike, weights: LoRAWeights, layout: str, naming: ModuleNaming = DIFFUSERS_NAMING,
               metadata: Mapping[str, str] | None = None, dtype: torch.dtype | None = None) -> Path:
    """Writes ``weights`` to ``path`` in ``layout``, atomically, with metadata that says what the file is.

    Args:
        metadata: Entries kept as they are (base model, step, ...); the layout's own entries win over them.

    Returns:
        ``path`` as a ``Path``.

    Raises:
        NonFiniteTensorError: A factor holds NaN or inf once folded and cast; nothing is written.
    """
    tensors, layout_entries = to_state_dict(weights, layout, naming, dtype)
    # Checked after folding and casting: a scale folded into float16 factors can overflow to inf.
    require_finite(tensors, f"not writing LoRA file {path}")
    entries = {"format": "pt", **{key: str(value) for key, value in (metadata or {}).items()},
               **describe_metadata(weights, naming), **layout_entries}
    return atomic_save_safetensors(tensors, path, entries)


# ---- reading ---------------------------------------------------------------------------------------------------


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
        layers[name] = _Pending(key_prefix, parts["down"], parts["up"], alphas.get(key_prefix))
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
        native = naming.to_native(name) or name
        weights[name] = pending.layer(name, native, settings, folded, where)
    layout = _layout_name(prefixes, kinds, bool(alphas), file_metadata, native_hits)
    return LoRAWeights(weights, layout, file_metadata, where, unmatched)


def _group(tensors: Mapping[str, torch.Tensor], where: str
           ) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, float], set[str]]:
    """``(factors per key prefix, alpha per key prefix, kinds of keys seen: "kohya" and/or "adapter")``."""
    groups: dict[str, dict[str, torch.Tensor]] = {}
    alphas: dict[str, float] = {}
    unknown, adapters, kinds = [], set(), set()
    for key, tensor in tensors.items():
        match = _FACTOR_KEY.match(key)
        if match:
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
        raise ValueError(f"{where} holds keys that are not plain LoRA weights (DoRA, biases, other adapters): "
                         f"{unknown[:5]}{hint}")
    if len(adapters) > 1:
        raise ValueError(f"{where} holds several adapters {sorted(adapters)}; pass a file with only one")
    incomplete = [name for name, parts in groups.items() if len(parts) != 2]
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

    def _lookup(self, name: str) -> tuple[str, bool] | None:
        """``(diffusers name, whether the file used the native name)`` of a prefix-free name."""
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
                name = self.underscored.get(key_prefix[len(prefix):])
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
    down: torch.Tensor
    up: torch.Tensor
    alpha: float | None

    def layer(self, name: str, native: str, settings: _Settings, folded: Callable[[str], float | None],
              where: str) -> LoRALayer:
        rank = self.down.shape[0]
        if self.alpha is not None:  # every tool reads a per-layer alpha first
            return LoRALayer(self.down, self.up, self.alpha / rank)
        folded_scale = folded(native)
        folded_scale = folded(name) if folded_scale is None else folded_scale
        if folded_scale is not None:
            if folded_scale == 0 or not math.isfinite(folded_scale):
                raise ValueError(f"{FOLDED_SCALE_KEY} of layer {native!r} in {where} is {folded_scale}; it must be a "
                                 "non-zero finite number")
            # The file's factors hold the scale already; dividing it out restores the trained factors.
            return LoRALayer(self.down, self.up.float() / folded_scale, folded_scale)
        if settings.rank is not None and settings.rank != rank:
            raise ValueError(f"LoRA layer {self.key_prefix!r} in {where} has rank {rank} but the metadata says rank "
                             f"{settings.rank}; fix the metadata or pass metadata= with the right rank")
        return LoRALayer(self.down, self.up, settings.scale(name, rank))


def _layout_name(prefixes: set[str], kinds: set[str], has_alpha: bool, metadata: Mapping[str, str],
                 native_hits: int) -> str:
    declared = metadata.get(_META + "layout")
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
