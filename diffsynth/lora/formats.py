"""The LoRA file layouts and how they are written: with :mod:`.reading` and :mod:`.adapters` (LoHa, LoKr and
DoRA, written by :func:`_lycoris_state_dict` in the universal and kohya layouts), the one place that spells LoRA keys.

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
and musubi-tuner all load fully at strength 1.0 (checked by ``python -m diffsynth.lora inspect``). FLUX.2's universal
keys have no ``diffusion_model.`` prefix (``ModuleNaming.universal_prefix``): ComfyUI reads its names bare; diffusers
then gets a diffusers-layout twin file (``training.outputs.logger``). FLUX.1's are diffusers' names under
``transformer.``, which diffusers, ComfyUI and DiffSynth-Studio all take (DiffSynth-Studio the block layers only: its
FLUX.1 loader maps no embedder and no final layer in any layout).

FLUX.1's and FLUX.2's kohya files name BFL's fused layers (``lora_unet_double_blocks_0_img_attn_qkv``,
``ModuleNaming.fused``), as kohya's sd-scripts and the reference's ``--align_to_opensource_format`` do for FLUX.1, and
as the released FLUX.2 checkpoint names them (ComfyUI reads no ``lora_unet_`` name of a diffusers FLUX.2 layer).
The per-projection LoRAs of one fused layer become one LoRA of their summed rank, exactly (:func:`fuse_layers`): the downs stacked, the ups block-diagonal, zeros
for a projection not trained. Their scale is folded and no ``alpha`` is written, since DiffSynth-Studio's FLUX.1 loader
applies the first alpha it finds to every layer (and again on a second pass). Reading splits such a layer back
(:func:`split_fused`), also one whose parts share one down (a LoRA trained on the fused layer).

Reading (:mod:`.reading`) accepts all four, plus this project's earlier files (diffusers layout with a plain
``lora_alpha`` entry), any of the prefixes in :data:`STRIPPED_PREFIXES`, and diffusers' or native names. A scale
folded into ``lora_B`` is recorded in the metadata (``diffsynth.lora.folded_scale``) and unfolded on reading, so a
file read back holds the factors that were trained, and is never scaled twice.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..core.files import atomic_save_safetensors
from ..core.finite import require_finite
from .adapters import TYPE_KEY, LoHaLayer, LoKrLayer, adapter_type, dora_delta
from .naming import DIFFUSERS_NAMING, FusedLayer, FusedNaming, ModuleNaming

LAYOUTS = ("universal", "diffusers", "kohya", "peft")
FORMAT_VERSION = 2
# Prefixes tools put before module names; stripped one after another until a module matches.
STRIPPED_PREFIXES = ("transformer.", "diffusion_model.", "base_model.model.", "pipe.dit.", "model.", "unet.")
UNDERSCORE_PREFIXES = ("lora_unet_", "lora_transformer_", "lycoris_")
DIFFUSERS_COMPONENT = "transformer"
FOLDED_SCALE_KEY = "diffsynth.lora.folded_scale"
MODEL_CLASS_KEY = "diffsynth.lora.base_model_class"
MODEL_CONFIG_KEY = "diffsynth.lora.base_model_config"
LAYOUT_KEY = "diffsynth.lora.layout"
_META = "diffsynth.lora."
# A factor's key: ``<layer>.<part>[.<adapter>].weight``.
FACTOR_KEY = re.compile(r"^(?P<layer>.+?)\.(?P<part>lora_A|lora_B|lora_down|lora_up)(?:\.(?P<adapter>[^.]+))?"
                        r"\.weight$")


@dataclass
class LoRALayer:
    """One layer of a LoRA: ``delta W = scale * up @ down`` (a conv ``down`` keeps its kernel, ``up`` is 1x1).

    With ``dora_scale`` (1-D, one entry per output row) it is a DoRA layer, whose change depends on the base weight
    (:func:`.adapters.dora_delta`, ComfyUI's rule)."""

    down: torch.Tensor
    up: torch.Tensor
    scale: float = 1.0
    dora_scale: torch.Tensor | None = None
    kind = "lora"

    @property
    def rank(self) -> int:
        return self.down.shape[0]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.up.shape[0], *self.down.shape[1:]

    def delta(self, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
              base: torch.Tensor | None = None) -> torch.Tensor:
        """The weight change, shaped like the module's weight, computed in ``dtype`` on ``device`` (a DoRA layer
        needs the module's weight as ``base``)."""
        if self.dora_scale is not None:
            return dora_delta(self.down, self.up, self.scale, self.dora_scale, base, dtype, device)
        product = self.up.to(device, dtype).flatten(1) @ self.down.to(device, dtype).flatten(1)
        return self.scale * product.reshape(self.up.shape[0], *self.down.shape[1:])

    def factors(self) -> dict[str, torch.Tensor]:
        return {"lora_A": self.down, "lora_B": self.up}

    def rescaled(self, factor: float) -> LoRALayer:
        """The same layer with its change multiplied by ``factor`` (folded into ``up``), at scale 1."""
        return LoRALayer(self.down, self.up.float() * (self.scale * factor), 1.0, self.dora_scale)


AdapterLayer = LoRALayer | LoHaLayer | LoKrLayer


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

    layers: dict[str, AdapterLayer]
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
        return {"type": adapter_type(self.layers), "rank": rank, "alpha": alpha, "scale": scale,
                "layers": len(self.layers), "targets": sorted({_suffix(name) for name in self.layers})}


def _suffix(name: str) -> str:
    """``blocks.3.attn1.to_q`` -> ``attn1.to_q``: the part of a layer name that repeats across blocks."""
    return re.sub(r"^(?:[a-z_]*blocks)\.\d+\.", "", name)


def _plain_number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def is_peft_lora_key(key: str) -> bool:
    """Whether ``key`` names a peft LoRA factor (``<module>.lora_A[.<adapter>].weight`` or ``lora_B``)."""
    match = FACTOR_KEY.match(key)
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
        match = FACTOR_KEY.match(key.removeprefix(prefix))
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
        naming: The model's native naming (universal, kohya and peft name layers natively; kohya files name the
            fused layers of ``naming.fused`` where it has them, FLUX.1's).
        dtype: Storage dtype of the factors; None keeps theirs. Folding happens in float32 first.

    Raises:
        ValueError: Unknown layout, or a layer the native naming has no name for.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown LoRA layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    kind = adapter_type(weights.layers)
    if kind != "lora":
        return _lycoris_state_dict(weights, kind, layout, naming, dtype)
    uniform = len(weights.ranks) == 1 and len(weights.scales) == 1
    fused = naming.fuses(layout)
    fold = layout in ("universal", "peft") or (layout == "diffusers" and not uniform) or fused
    tensors, metadata, folded = {}, {}, {}

    def store(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().to("cpu", dtype or tensor.dtype).contiguous()

    for file_name, layer in _file_layers(weights, layout, naming):
        up, down = layer.up, layer.down
        if fold:
            up = layer.up.float() * layer.scale
            folded[file_name] = layer.scale
        if layout == "universal":
            tensors[f"{naming.universal_prefix}{file_name}.lora_A.weight"] = store(down)
            tensors[f"{naming.universal_prefix}{file_name}.lora_B.weight"] = store(up)
        elif layout == "peft":
            tensors[f"{file_name}.lora_A.default.weight"] = store(down)
            tensors[f"{file_name}.lora_B.default.weight"] = store(up)
        elif layout == "kohya":
            stem = "lora_unet_" + file_name.replace(".", "_")
            tensors[f"{stem}.lora_down.weight"] = store(down)
            tensors[f"{stem}.lora_up.weight"] = store(up)
            if not fold:
                tensors[f"{stem}.alpha"] = torch.tensor(float(layer.scale * layer.rank))
        else:
            tensors[f"{DIFFUSERS_COMPONENT}.{file_name}.lora_A.weight"] = store(down)
            tensors[f"{DIFFUSERS_COMPONENT}.{file_name}.lora_B.weight"] = store(up)
    if layout == "diffusers" and uniform:
        rank, scale = next(iter(weights.ranks)), next(iter(weights.scales))
        config = {"r": rank, "lora_alpha": _plain_number(scale * rank), "target_modules": sorted(weights.layers)}
        metadata["lora_adapter_metadata"] = json.dumps({f"{DIFFUSERS_COMPONENT}.{key}": value
                                                        for key, value in config.items()}, sort_keys=True)
    if folded:
        values = set(folded.values())
        metadata[FOLDED_SCALE_KEY] = (repr(float(next(iter(values)))) if len(values) == 1
                                      else json.dumps(folded, sort_keys=True))
    metadata[LAYOUT_KEY] = layout
    metadata[_META + "format_version"] = str(FORMAT_VERSION)
    return tensors, metadata


def _lycoris_state_dict(weights: LoRAWeights, kind: str, layout: str, naming: ModuleNaming,
                        dtype: torch.dtype | None) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A LoHa, LoKr or DoRA file's tensors and entries (:mod:`.adapters`): LyCORIS's key names under the universal
    or the kohya layout's prefix, a per-layer ``alpha`` (a DoRA layer's scale folded into ``lora_B`` in the universal
    layout, as for a plain LoRA; a LoKr layer of two whole factors folds it into ``lokr_w1``, since ComfyUI ignores its
    ``alpha``), and a DoRA layer's ``dora_scale`` shaped ``(out, 1, ...)`` as ComfyUI broadcasts it."""
    if layout not in ("universal", "kohya"):
        raise ValueError(f"a {kind} LoRA is written in the universal or kohya layout, not {layout}: diffusers' "
                         "load_lora_weights reads neither LoHa, LoKr nor DoRA's dora_scale (docs/en/LoRA_Types.md)")
    if kind == "mixed":
        raise ValueError("the LoRA mixes adapter types; a file holds one type")
    if layout == "kohya" and naming.fused is not None:
        raise ValueError(f"a {kind} LoRA cannot name {naming.name}'s fused layers in the kohya layout; write the "
                         "universal layout")
    tensors, folded = {}, {}
    # Their universal files keep the unfused names: a LoHa or LoKr is not split into a fused layer's parts.
    for native, layer in _file_layers(weights, layout, naming, fuse=False):
        stem = (f"{naming.universal_prefix}{native}" if layout == "universal"
                else "lora_unet_" + native.replace(".", "_"))
        alpha = None
        if isinstance(layer, LoRALayer):
            parts = {"lora_A.weight": layer.down, "lora_B.weight": layer.up}
            if layout == "kohya":
                parts = {"lora_down.weight": layer.down, "lora_up.weight": layer.up}
                alpha = layer.scale * layer.rank
            else:
                parts["lora_B.weight"] = layer.up.float() * layer.scale
                folded[native] = layer.scale
            parts["dora_scale"] = layer.dora_scale.float().reshape(-1, *[1] * (layer.down.dim() - 1))
        elif layer.rank is None:  # a LoKr layer of two whole factors
            parts = layer.rescaled(1.0).factors()
        else:
            parts, alpha = layer.factors(), layer.scale * layer.rank
        for suffix, tensor in parts.items():
            tensors[f"{stem}.{suffix}"] = tensor.detach().to("cpu", dtype or tensor.dtype).contiguous()
        if alpha is not None:
            tensors[f"{stem}.alpha"] = torch.tensor(float(alpha))
    metadata = {TYPE_KEY: kind, LAYOUT_KEY: layout, _META + "format_version": str(FORMAT_VERSION)}
    if folded:
        values = set(folded.values())
        metadata[FOLDED_SCALE_KEY] = (repr(float(next(iter(values)))) if len(values) == 1
                                      else json.dumps(folded, sort_keys=True))
    return tensors, metadata


def _file_layers(weights: LoRAWeights, layout: str, naming: ModuleNaming,
                 fuse: bool = True) -> list[tuple[str, AdapterLayer]]:
    """The layers under the names ``layout`` gives them: diffusers' (diffusers layout), the fused layers of
    ``naming.fused`` (with ``fuse``, in the layouts that name them: kohya for FLUX.1, universal too for Ideogram 4),
    or the native names."""
    if layout == "diffusers":
        return sorted(weights.layers.items())
    if fuse and naming.fuses(layout):
        return sorted(fuse_layers(weights.layers, naming.fused).items())
    named = []
    for name, layer in sorted(weights.layers.items()):
        native = naming.to_native(name)
        if native is None:
            raise ValueError(f"LoRA layer {name!r} has no name in the {naming.name} code, so a {layout} file cannot "
                             "name it; leave it out of --lora_target_modules, or write the diffusers layout")
        named.append((native, layer))
    return named


def fuse_layers(layers: Mapping[str, LoRALayer], fused: FusedNaming) -> dict[str, LoRALayer]:
    """The LoRAs of diffusers layers as LoRAs of the original release's fused layers, with the same updates.

    The parts of one fused layer (``to_q``, ``to_k``, ``to_v`` of ``img_attn.qkv``) become one LoRA of their summed
    rank: their downs stacked, their ups placed block-diagonally, so each part's rows get exactly its own update. A
    part not trained gets a zero block of the others' rank, which keeps the blocks equal (diffusers' kohya converter
    then splits them back per part too) and which :func:`split_fused` leaves out again.

    Args:
        layers: ``{diffusers layer name: LoRALayer}``.
        fused: The original release's naming.

    Returns:
        ``{native layer name: LoRALayer}``, each at the scale of its first part (the others' folded into their ups).

    Raises:
        ValueError: A layer the original code has no name for.
    """
    groups: dict[str, dict[int, LoRALayer]] = {}
    for name, layer in layers.items():
        located = fused.locate(name)
        if located is None:
            raise ValueError(f"LoRA layer {name!r} has no name in the {fused.name} code, so a kohya file cannot name "
                             "it; leave it out of --lora_target_modules, or write the universal layout")
        native, index = located
        groups.setdefault(native, {})[index] = layer
    return {native: _fuse(fused.parts(native)[0], parts) for native, parts in groups.items()}


def _fuse(spec: FusedLayer, parts: Mapping[int, LoRALayer]) -> LoRALayer:
    present = [parts[index] for index in sorted(parts)]
    first = present[0]
    if len(spec.parts) == 1:
        return LoRALayer(first.down, spec.join_rows([first.up]), first.scale)
    rank = max(layer.rank for layer in present)
    in_features = first.down.shape[1]
    ranks = [parts[index].rank if index in parts else rank for index in range(len(spec.parts))]
    downs, ups, column = [], [], 0
    for index, rows in enumerate(spec.row_counts(in_features)):
        layer = parts.get(index)
        up = first.up.new_zeros(rows, sum(ranks))
        if layer is None:
            downs.append(first.down.new_zeros(rank, in_features))
        else:
            downs.append(layer.down)
            up[:, column:column + layer.rank] = layer.up * (layer.scale / first.scale)
        ups.append(up)
        column += ranks[index]
    return LoRALayer(torch.cat(downs), spec.join_rows(ups), first.scale)


def split_fused(layer: LoRALayer, spec: FusedLayer) -> list[LoRALayer | None]:
    """The LoRAs of a fused layer's diffusers parts, each giving exactly its rows of the fused update.

    A block-diagonal LoRA (:func:`fuse_layers`, kohya's sd-scripts: the rank divides into one equal block per part,
    each part's up rows zero outside its block) gives each part its block of the down and the up; any other (one down
    shared by all parts, as a LoRA trained on the fused layer has) gives each part the whole down and its up rows.

    Returns:
        One LoRA per part of ``spec``, None for a part whose block is all zeros (a projection not trained).

    Raises:
        ValueError: The up factor has not the rows of the fused layer.
    """
    ups = spec.split_rows(layer.up, layer.down.shape[1])
    count = len(ups)
    if count > 1 and layer.rank % count == 0:
        size = layer.rank // count
        blocks = [(index * size, (index + 1) * size) for index in range(count)]
        if all(not up[:, :start].any() and not up[:, stop:].any() for up, (start, stop) in zip(ups, blocks)):
            parts = []
            for up, (start, stop) in zip(ups, blocks):
                down, block = layer.down[start:stop], up[:, start:stop]
                parts.append(LoRALayer(down, block, layer.scale) if down.any() or block.any() else None)
            return parts
    return [LoRALayer(layer.down, up, layer.scale) for up in ups]


def describe_metadata(weights: LoRAWeights, naming: ModuleNaming) -> dict[str, str]:
    """The entries that say what a LoRA is: rank, the alpha its strength 1.0 corresponds to, targets, naming."""
    info = weights.describe()
    entries = {_META + "layers": str(info["layers"]), _META + "targets": ",".join(info["targets"]),
               _META + "native_naming": naming.name}
    if info["rank"] is not None:
        entries["lora_rank"] = str(info["rank"])
    if info["alpha"] is not None:
        entries[_META + "alpha"] = str(info["alpha"])
    if info["type"] != "lora":
        entries[TYPE_KEY] = info["type"]
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
