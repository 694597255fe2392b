"""How the tools users generate with would load a LoRA file: which layers land on a module, at what strength.

Each function below follows one tool's own loading code, as read in its repository (December 2026), on the file's
keys and the model's layer names; none needs the tool installed except diffusers, whose real key conversion runs:

* diffusers: ``QwenImageLoraLoaderMixin`` / ``WanLoraLoaderMixin`` / ``ZImageLoraLoaderMixin`` /
  ``Flux2LoraLoaderMixin`` / ``FluxLoraLoaderMixin.lora_state_dict`` (real code), then ``load_lora_adapter``: keys
  under ``transformer.`` only, scale from ``lora_adapter_metadata`` or alpha = rank. (Its FLUX.1 kohya converter
  names the embedders and the final layer without ``transformer.``, so they are dropped, and splits
  ``single_blocks.N.linear1`` at the released widths, failing on any other.)
* ComfyUI (``comfy/lora.py``): for FLUX.1 and FLUX.2 its Flux key map (diffusers names bare or under
  ``transformer.``, see ``_COMFY_BFL_LAYERS``), and for FLUX.1 also its own BFL names, ``diffusion_model.<bfl>`` and
  ``lora_unet_<bfl with _>``, each patching a whole fused layer; otherwise ``diffusion_model.<native>`` and
  ``lora_unet_<native with _>`` (plus, for Qwen-Image and Z-Image, ``<native>`` and ``transformer.<native>``; Z-Image's
  diffusers names land on NextDiT's fused ``attention.qkv`` as slices, and its ``lora_unet_`` keys follow NextDiT's
  names); factors ``lora_up/down``, ``lora_B/A`` (also ``.default``); scale ``<key>.alpha`` / rank, else 1.
* DiffSynth-Studio (``GeneralLoRALoader``): every ``lora_B``/``lora_up`` key, adapter name and one leading
  ``diffusion_model`` dropped, must name a module of its model (native names); scale ``alpha`` / rank, else 1. For
  FLUX.1 its ``FluxLoRALoader`` instead (``_diffsynth_studio_bfl``).
* musubi-tuner (its Wan, Qwen-Image and FLUX.1 Kontext generate scripts and network merge): only
  ``lora_unet_<native with _>`` keys with ``lora_down``/``lora_up`` and ``.alpha`` are read (for FLUX.1, BFL's fused
  layers inside its double and single blocks); any other file must first go through its ``convert_lora.py --target
  default`` (or ``python -m diffsynth.lora convert ... --to kohya``).

These emulations were checked once against the tools' real code on tiny models (ComfyUI a125cd84, DiffSynth-Studio
fed7b18f, musubi-tuner 30c658c4; see the session notes of December 2026; for FLUX.1, ComfyUI's key map and
``load_lora`` with ``scripts/check_comfyui_flux_lora.py``, and for Wan and its control models, VACE, Fun and FLF2V,
with ``scripts/check_comfyui_wan_lora.py``, and for SD 1.5, SDXL, ERNIE-Image, FLUX.2 and Qwen-Image with
``scripts/check_comfyui_image_lora.py``; DiffSynth-Studio's ``FluxLoRALoader`` as its
``load_lora`` runs it, converting twice). The strength a tool applies is measured, not assumed: each
layer's delta as the tool builds it is compared with the delta this project reads, on a random probe vector. A tool
patching a fused layer is measured on each diffusers layer it holds (the rows of the patch that land on it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from ..pipelines.registry import LoraTools, family_of_class
from .adapters import LOHA_PARTS, LOKR_PARTS, LoHaLayer, LoKrLayer
from .diffusers_tool import diffusers_layers
from .formats import AdapterLayer, LoRALayer, LoRAWeights
from .naming import FusedLayer, ModuleNaming
from .reading import read_lora

TOOLS = ("diffsynth", "diffusers", "ComfyUI", "DiffSynth-Studio", "musubi-tuner")
_TOLERANCE = 1e-3


@dataclass
class ToolResult:
    """What one tool does with a file.

    Attributes:
        tool: One of :data:`TOOLS`.
        mapped: LoRA layers the tool applies to a module of the model (with fitting shapes).
        total: LoRA layers in the file.
        strength: Applied strength / trained strength at the tool's strength 1.0, when equal across layers; None
            when it varies (``strengths`` has the range) or nothing maps.
        strengths: ``(lowest, highest)`` ratio over the mapped layers.
        unloaded: Keys of the file the tool leaves unused (the first few).
        error: The tool's own error, when its loader raises.
    """

    tool: str
    mapped: int
    total: int
    strength: float | None = None
    strengths: tuple[float, float] | None = None
    unloaded: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        """The whole file loads at the trained strength."""
        return self.error is None and self.mapped == self.total and self.strength is not None and abs(
            self.strength - 1.0) <= _TOLERANCE


Applied = dict[str, AdapterLayer]
# What a tool's key patches: one diffusers layer, or a fused layer of the original code and the diffusers layers in it.
Target = str | tuple[FusedLayer, list[str]]
Emulation = Callable[[Mapping[str, torch.Tensor], Mapping[str, str], "_Model"], tuple[Applied, list[str]]]


@dataclass
class _Model:
    class_name: str
    weights: dict[str, torch.Size]  # LoRA-able layer (diffusers name) -> weight shape
    naming: ModuleNaming
    tools: LoraTools | None  # how the real tools load the family's files; None for a class no family trains

    def native_names(self) -> dict[str, str]:
        """native name -> diffusers name, for the layers the native code has."""
        table = {}
        for name in self.weights:
            native = self.naming.to_native(name)
            if native is not None:
                table[native] = name
        return table

    def native_targets(self) -> dict[str, Target]:
        """native name -> what a key of that name patches: the fused layers where the native code's names are
        ``naming.fused``'s in every layout (Ideogram 4's ``attention.qkv``), else ``native_names``."""
        return dict(self.fused_layers()) if self.naming.fuses("universal") else dict(self.native_names())

    def fused_layers(self) -> dict[str, tuple[FusedLayer, list[str]]]:
        """fused layer name -> (its layout, the diffusers layers in it), for the original code's layers the model has
        (``naming.fused``, FLUX.1's BFL layers)."""
        fused, table = self.naming.fused, {}
        for name in self.weights:
            located = fused.locate(name)
            if located is not None:
                table[located[0]] = fused.parts(located[0])
        return table


def check_tools(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str], class_name: str,
                weight_shapes: Mapping[str, torch.Size], naming: ModuleNaming) -> list[ToolResult]:
    """Emulates every tool of :data:`TOOLS` on a LoRA file's tensors and metadata.

    Args:
        tensors, metadata: The file's content.
        class_name: The diffusers class of the model the LoRA is for.
        weight_shapes: The model's LoRA-able layers (diffusers names) and their weight shapes (a meta-device
            skeleton has them).
        naming: The model's original-release naming.
    """
    spec = family_of_class(class_name)
    model = _Model(class_name, dict(weight_shapes), naming, spec.lora_tools if spec else None)
    reference = read_lora(dict(tensors), model.weights, naming, metadata, strict=False)
    return [_measure(tool, emulation, tensors, metadata, model, reference) for tool, emulation in _EMULATIONS.items()]


_EMULATIONS: dict[str, Emulation] = {}  # filled below, once the emulations are defined


def tool_layers(tool: str, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str], class_name: str,
                weight_shapes: Mapping[str, torch.Size], naming: ModuleNaming | None = None
                ) -> tuple[Applied, list[str]]:
    """What one tool of :data:`TOOLS` applies: ``({diffusers layer name: the layer as the tool builds it}, the file's
    keys it leaves unused)``; ``naming`` None takes the class's."""
    from .naming import naming_for

    spec = family_of_class(class_name)
    model = _Model(class_name, dict(weight_shapes), naming or naming_for(class_name), spec.lora_tools if spec else None)
    return _EMULATIONS[tool](tensors, metadata, model)


def _measure(tool: str, emulation: Emulation, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str],
             model: _Model, reference: LoRAWeights) -> ToolResult:
    total = len(reference.layers) + len(reference.unmatched)
    try:
        applied, unloaded = emulation(tensors, metadata, model)
    except Exception as error:  # noqa: BLE001 - the tool's loader raising is the finding
        return ToolResult(tool, 0, total, error=f"{type(error).__name__}: {error}")
    generator = torch.Generator().manual_seed(0)
    ratios = []
    for name, layer in applied.items():
        intended = reference.layers.get(name)
        if intended is None or not _fits(layer, model.weights.get(name)):
            continue
        shape = torch.Size(model.weights[name])
        probe = torch.randn(shape[1:].numel(), generator=generator)
        # A DoRA change depends on the base weight: any weight tells whether the tool applies the same rule.
        base = None if _is_plain(layer) and _is_plain(intended) else torch.randn(shape, generator=generator)
        got, want = _apply(layer, probe, base), _apply(intended, probe, base)
        norm = float(want @ want)
        ratios.append(float(got @ want) / norm if norm > 0 else 1.0)
    result = ToolResult(tool, len(ratios), total, unloaded=unloaded[:5])
    if ratios:
        result.strengths = (min(ratios), max(ratios))
        if result.strengths[1] - result.strengths[0] <= _TOLERANCE * max(1.0, abs(result.strengths[1])):
            result.strength = sum(ratios) / len(ratios)
    return result


def _land(applied: Applied, target: Target, layer: LoRALayer) -> bool:
    """Records a tool's patch of ``target`` as the diffusers layers see it: a fused layer's patch gives each layer in
    it its rows. False where the patch does not fit the fused layer (the tools then skip it)."""
    if isinstance(target, str):
        applied[target] = layer
        return True
    if not _is_plain(layer):
        return False  # no fused layer is patched by a LoHa, LoKr or DoRA file here
    spec, names = target
    try:
        rows = spec.split_rows(layer.up, layer.down.shape[1])
    except ValueError:
        return False
    applied.update({name: LoRALayer(layer.down, part, layer.scale) for name, part in zip(names, rows)})
    return True


def _is_plain(layer: AdapterLayer) -> bool:
    return isinstance(layer, LoRALayer) and layer.dora_scale is None


def _apply(layer: AdapterLayer, probe: torch.Tensor, base: torch.Tensor | None) -> torch.Tensor:
    if _is_plain(layer):  # without building the change: a 20B model's inspection stays quick
        return layer.scale * (layer.up.float().flatten(1) @ (layer.down.float().flatten(1) @ probe))
    return layer.delta(base=base).flatten(1) @ probe


def _fits(layer: AdapterLayer, shape: torch.Size | None) -> bool:
    if shape is None:
        return False
    if not isinstance(layer, LoRALayer):
        return tuple(layer.shape) == tuple(shape)
    down, up = layer.down, layer.up
    return up.dim() == down.dim() >= 2 and up.shape[1] == down.shape[0] and (up.shape[0], *down.shape[1:]) == tuple(
        shape)


def _diffsynth(tensors, metadata, model: _Model) -> tuple[Applied, list[str]]:
    weights = read_lora(dict(tensors), model.weights, model.naming, metadata, strict=False)
    return weights.layers, weights.unmatched


_COMFY_FACTORS = ((".lora_up.weight", ".lora_down.weight"), ("_lora.up.weight", "_lora.down.weight"),
                  (".lora_B.weight", ".lora_A.weight"), (".lora.up.weight", ".lora.down.weight"),
                  (".lora_B", ".lora_A"), (".lora_linear_layer.up.weight", ".lora_linear_layer.down.weight"),
                  (".lora_B.default.weight", ".lora_A.default.weight"))


def _comfy_lumina2_native(name: str) -> str | None:
    """The name of diffusers layer ``name`` (Z-Image) in ComfyUI's NextDiT, None for to_q/to_k/to_v (fused there into
    ``attention.qkv``, which only diffusers-named keys reach, as slices)."""
    if re.search(r"\.attention\.to_[qkv]$", name):
        return None
    name = name.replace(".attention.to_out.0", ".attention.out")
    return name.replace("all_x_embedder.2-1", "x_embedder").replace("all_final_layer.2-1.", "final_layer.")


# The diffusers FLUX.1 / FLUX.2 layers comfy/utils.flux_to_diffusers maps onto BFL's layout (ComfyUI 09708ea):
# fused q/k/v and FLUX.2's fused single-block projections as slices or whole, the embedders and the final layer.
# FLUX.2's shared modulation layers and its time_guidance_embed have no entry there, so ComfyUI skips them.
_COMFY_BFL_LAYERS = re.compile(
    r"^(transformer_blocks\.\d+\.(attn\.(to_[qkv]|add_[qkv]_proj|to_out\.0|to_add_out)"
    r"|(ff|ff_context)\.(linear_in|linear_out|net\.0\.proj|net\.2)|norm1(_context)?\.linear)"
    r"|single_transformer_blocks\.\d+\.(attn\.(to_[qkv]|to_qkv_mlp_proj|to_out)|proj_mlp|proj_out|norm\.linear)"
    r"|x_embedder|context_embedder|proj_out|norm_out\.linear|time_text_embed\..+)$")


def _comfy_bfl_key_map(model: _Model) -> dict[str, Target]:
    """ComfyUI's Flux branch: diffusers names bare (DiffSynth-Studio's files; ComfyUI a125cd84 lacks these), under
    ``transformer.``, and its underscore forms; for FLUX.1 also the generic keys of its own module names (BFL's),
    ``diffusion_model.<bfl>`` and ``lora_unet_<bfl with _>``, each patching a whole fused layer. (Its
    ``diffusion_model.single_blocks.N.linear1_qkv``, the q/k/v rows of ``linear1``, no file here names.)"""
    key_map: dict[str, Target] = {}
    for name in model.weights:
        if _COMFY_BFL_LAYERS.match(name):
            key_map[name] = key_map[f"transformer.{name}"] = name
            key_map["lycoris_" + name.replace(".", "_")] = key_map["lora_transformer_" + name.replace(".", "_")] = name
    if model.naming.fused is not None:
        for native, target in model.fused_layers().items():
            key_map[f"diffusion_model.{native}"] = key_map["lora_unet_" + native.replace(".", "_")] = target
    return key_map


def _comfy_native_key_map(model: _Model) -> dict[str, Target]:
    """ComfyUI's generic key map of the model's native names, with the additions of its Qwen-Image branch
    (``native_bare``) and its Lumina2 branch (``lumina2``, Z-Image)."""
    key_map, key_maps = {}, model.tools.comfyui_key_map if model.tools else "native"
    for native, name in model.native_targets().items():
        key_map[f"diffusion_model.{native}"] = name
        if key_maps == "lumina2":
            # Lumina2's key map: diffusers names under these prefixes; lora_unet_ keys follow NextDiT's own names.
            key_map[native] = key_map[f"transformer.{native}"] = name
            key_map["lycoris_" + native.replace(".", "_")] = name
            comfy_native = _comfy_lumina2_native(name)
            if comfy_native is not None:
                key_map["lora_unet_" + comfy_native.replace(".", "_")] = name
            continue
        key_map["lora_unet_" + native.replace(".", "_")] = name
        if key_maps == "native_bare":
            key_map[native] = name
            key_map[f"transformer.{native}"] = name
            key_map["lycoris_" + native.replace(".", "_")] = name
    return key_map


def _comfyui(tensors, metadata, model: _Model) -> tuple[Applied, list[str]]:
    bfl = model.tools is not None and model.tools.comfyui_key_map == "bfl"
    key_map: Mapping[str, Target] = _comfy_bfl_key_map(model) if bfl else _comfy_native_key_map(model)
    applied, used = {}, set()
    for prefix, target in key_map.items():
        alpha = tensors.get(prefix + ".alpha")
        dora_scale = tensors.get(prefix + ".dora_scale")
        lycoris = _comfy_lycoris(prefix, tensors, None if alpha is None else float(alpha))
        if lycoris is not None:
            layer, keys = lycoris
            if _land(applied, target, layer):
                used.update({*keys, prefix + ".alpha"})
            continue
        for up_suffix, down_suffix in _COMFY_FACTORS:
            if prefix + up_suffix in tensors:
                up, down = tensors[prefix + up_suffix], tensors[prefix + down_suffix]
                scale = 1.0 if alpha is None else float(alpha) / down.shape[0]
                # comfy/weight_adapter/base.weight_decompose: an output-axis dora_scale, normalised by the base
                # weight's row norms (an input-axis one it normalises otherwise; no file here has one).
                magnitude = None if dora_scale is None else dora_scale.float().flatten()
                if _land(applied, target, LoRALayer(down, up, scale, magnitude)):
                    used.update({prefix + up_suffix, prefix + down_suffix, prefix + ".alpha", prefix + ".dora_scale"})
                break
    return applied, sorted(key for key in tensors if key not in used)


def _comfy_lycoris(prefix: str, tensors: Mapping[str, torch.Tensor], alpha: float | None
                   ) -> tuple[AdapterLayer, set[str]] | None:
    """ComfyUI's LoHa and LoKr adapters (``comfy/weight_adapter/loha.py``, ``lokr.py``) for one key prefix: LoHa's
    scale is alpha / the rank of ``hada_w1_b``; LoKr's alpha / the rank of ``lokr_w2_b`` if ``w2`` is decomposed, else
    of ``lokr_w1_b``, and 1 when neither is (alpha unused). None when the prefix has neither."""
    if prefix + ".hada_w1_a" in tensors:
        parts = [tensors[f"{prefix}.{part}"] for part in LOHA_PARTS]
        scale = 1.0 if alpha is None else alpha / parts[1].shape[0]
        return LoHaLayer(*parts, scale), {f"{prefix}.{part}" for part in LOHA_PARTS}
    parts = {part: tensors[f"{prefix}.{part}"] for part in LOKR_PARTS if f"{prefix}.{part}" in tensors}
    if not parts.keys() & {"lokr_w1", "lokr_w2", "lokr_w1_a", "lokr_w2_a"}:
        return None
    dim = None
    if "lokr_w1" not in parts:
        dim = parts["lokr_w1_b"].shape[0]
    if "lokr_w2" not in parts:
        dim = parts["lokr_w2_b"].shape[0]
    scale = alpha / dim if alpha is not None and dim is not None else 1.0
    return LoKrLayer(parts, scale), {f"{prefix}.{part}" for part in parts}


def _diffsynth_studio(tensors, metadata, model: _Model) -> tuple[Applied, list[str]]:
    if model.tools is not None and model.tools.diffsynth_studio_loader == "bfl":
        return _diffsynth_studio_bfl(tensors, model)
    natives = model.native_targets()
    if model.tools is not None and model.tools.diffsynth_studio_loader == "native_or_diffusers":
        # Its Krea 2 loader renames diffusers' names under transformer. (Krea's LoRA releases) to its own.
        natives.update({f"transformer.{name}": name for name in natives.values()})
    applied, used = {}, set()
    for key in tensors:
        up_part, down_part = ("lora_up", "lora_down") if ".lora_up." in key else ("lora_B", "lora_A")
        if up_part not in key:
            continue
        parts = key.split(".")
        index = parts.index(up_part)
        if len(parts) > index + 2:
            parts.pop(index + 1)
        parts.pop(index)
        if parts[0] == "diffusion_model":
            parts.pop(0)
        target = ".".join(parts[:-1])
        name = natives.get(target)
        alpha_key = key.replace(f"{up_part}.weight", "alpha").replace(f"{up_part}.default.weight", "alpha")
        if name is None:
            continue
        down = tensors[key.replace(up_part, down_part)]
        scale = float(tensors[alpha_key]) / down.shape[0] if alpha_key in tensors else 1.0
        if _land(applied, name, LoRALayer(down, tensors[key], scale)):
            used.update({key, key.replace(up_part, down_part), alpha_key})
    return applied, sorted(key for key in tensors if key not in used)


def _musubi(tensors, metadata, model: _Model) -> tuple[Applied, list[str]]:
    targets: dict[str, Target]
    if model.naming.fused is not None:
        # FLUX.1 Kontext (networks/lora_flux.py): LoRA modules only inside BFL's DoubleStreamBlock, SingleStreamBlock.
        targets = {native: target for native, target in model.fused_layers().items()
                   if native.startswith(("double_blocks.", "single_blocks."))}
    else:
        targets = {native: name for native, name in model.native_names().items()}
    applied, used = {}, set()
    for native, target in targets.items():
        stem = "lora_unet_" + native.replace(".", "_")
        if f"{stem}.lora_down.weight" in tensors and f"{stem}.lora_up.weight" in tensors:
            down, up = tensors[f"{stem}.lora_down.weight"], tensors[f"{stem}.lora_up.weight"]
            alpha = tensors.get(f"{stem}.alpha")
            scale = float(alpha) / down.shape[0] if alpha is not None else 1.0
            if _land(applied, target, LoRALayer(down, up, scale)):
                used.update({f"{stem}.lora_down.weight", f"{stem}.lora_up.weight", f"{stem}.alpha"})
    return applied, sorted(key for key in tensors if key not in used)


# DiffSynth-Studio's FluxLoRALoader (diffsynth/utils/lora/flux.py): the keys its diffusers_rename_dict renames
# (diffusers names under transformer.) and those of its civitai_rename_dict (BFL's, lora_unet_ with lora_down/up). Its
# FluxDiT names the embedders and the final layer otherwise, and neither dict maps them: they stay unused.
_DSS_BFL_DIFFUSERS = re.compile(
    r"^transformer\.(?P<layer>transformer_blocks\.\d+\.(?:attn\.(?:to_[qkv]|add_[qkv]_proj|to_out\.0|to_add_out)"
    r"|(?:ff|ff_context)\.net\.(?:0\.proj|2)|norm1(?:_context)?\.linear)"
    r"|single_transformer_blocks\.\d+\.(?:attn\.to_[qkv]|proj_mlp|proj_out|norm\.linear))"
    r"\.lora_(?P<part>[AB])\.weight$")
_DSS_BFL_BFL = re.compile(
    r"^lora_unet_(?P<stem>double_blocks_\d+_(?:img|txt)_(?:mod_lin|attn_qkv|attn_proj|mlp_0|mlp_2)"
    r"|single_blocks_\d+_(?:modulation_lin|linear1|linear2))\.lora_(?P<part>up|down)\.weight$")
# The q/k/v projections it stacks into one of FluxDiT's fused layers (a_to_qkv, b_to_qkv, to_qkv_mlp).
_DSS_BFL_FUSED = re.compile(r"^(?P<block>(?:single_)?transformer_blocks\.\d+\.attn\.)(?P<kind>to_|add_)[qkv]")


def _dss_first_alpha(tensors: Mapping[str, torch.Tensor], present: set[str]) -> float | None:
    """Its ``guess_alpha``: alpha / rank of the first ``.alpha`` entry whose layer's down is among ``present``."""
    for key, value in tensors.items():
        if ".alpha" in key:
            for suffix in (".lora_down.weight", ".lora_A.weight"):
                down = key.replace(".alpha", suffix)
                if down in present:
                    return float(value) / tensors[down].shape[0]
    return None


def _dss_bfl_scale(tensors: Mapping[str, torch.Tensor], renamed: set[str]) -> float:
    """The one scale its loader gives every layer. ``guess_alpha`` multiplies every tensor (alphas too) by the square
    root of the first alpha / rank; ``fuse_lora_to_base_model`` converts the result once more, where the alphas of
    layers it did not rename still find their down and scale everything again."""
    first = _dss_first_alpha(tensors, set(tensors))
    first = 1.0 if first is None else first
    kept = _dss_first_alpha(tensors, set(tensors) - renamed)
    return first * (1.0 if kept is None else kept * math.sqrt(first))


def _diffsynth_studio_bfl(tensors: Mapping[str, torch.Tensor], model: _Model) -> tuple[Applied, list[str]]:
    """DiffSynth-Studio's FLUX.1 loader: the first key holding ``lora_unet_`` or starting with ``transformer.`` decides
    which of its two renamings applies to the whole file; a file with neither is taken under FluxDiT's own names,
    which no layout here writes."""
    resource = next(("civitai" if "lora_unet_" in key else "diffusers" for key in tensors
                     if "lora_unet_" in key or key.startswith("transformer.")), None)
    pattern = {"civitai": _DSS_BFL_BFL, "diffusers": _DSS_BFL_DIFFUSERS}.get(resource)
    renamed = {key for key in tensors if pattern is not None and pattern.match(key)}
    scale = _dss_bfl_scale(tensors, renamed)
    applied: Applied = {}
    used: set[str] = set()
    if resource == "civitai":
        fused = model.naming.fused
        for key in sorted(renamed):
            if key.endswith(".lora_up.weight"):
                down_key = key.replace(".lora_up.", ".lora_down.")  # its loader fails on a missing down too
                target = fused.parts(fused.from_underscored(_DSS_BFL_BFL.match(key)["stem"]))
                if _land(applied, target, LoRALayer(tensors[down_key], tensors[key], scale)):
                    used.update({key, down_key, key.replace(".lora_up.weight", ".alpha")})
    elif resource == "diffusers":
        factors: dict[str, dict[str, torch.Tensor]] = {}
        for key in renamed:
            match = _DSS_BFL_DIFFUSERS.match(key)
            factors.setdefault(match["layer"], {})[match["part"]] = tensors[key]
        for name, parts in factors.items():
            if set(parts) != {"A", "B"}:
                raise KeyError(f"{name}: its loader needs both lora_A and lora_B")
            fused = _DSS_BFL_FUSED.match(name)
            if fused is not None:
                # q/k/v (add_q/k/v) become one layer when q is there, which then needs k and v of the same rank;
                # without q they keep names FluxDiT lacks. A single block's proj_mlp joins (zeros where absent).
                suffix = "_proj" if fused["kind"] == "add_" else ""
                group = [f"{fused['block']}{fused['kind']}{axis}{suffix}" for axis in "qkv"]
                if group[0] not in factors:
                    continue
                if any(member not in factors for member in group):
                    raise KeyError(f"its loader fuses {group} and lacks one of them")
                if len({factors[member]["A"].shape[0] for member in group}) != 1:
                    raise RuntimeError(f"its loader fuses {group} as blocks of one rank")
            elif name.endswith(".proj_mlp") and name.replace(".proj_mlp", ".attn.to_q") not in factors:
                continue
            applied[name] = LoRALayer(parts["A"], parts["B"], scale)
            used.update(f"transformer.{name}.lora_{part}.weight" for part in "AB")
    return applied, sorted(key for key in tensors if key not in used)


_EMULATIONS.update({"diffsynth": _diffsynth, "diffusers": diffusers_layers, "ComfyUI": _comfyui,
                    "DiffSynth-Studio": _diffsynth_studio, "musubi-tuner": _musubi})
