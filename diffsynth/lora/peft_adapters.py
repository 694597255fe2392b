"""peft's LoRA, DoRA, LoHa and LoKr weights as :class:`~.formats.LoRAWeights`, and back.

peft names a layer's weights ``<module>.lora_A.<adapter>.weight``, ``<module>.lora_magnitude_vector.<adapter>.weight``
(DoRA's magnitude ``m``), ``<module>.hada_w1_a.<adapter>`` or ``<module>.lokr_w1.<adapter>``; its scale is
``alpha / r`` for every type. A file holds ComfyUI's ``dora_scale`` instead of ``m`` (:mod:`.adapters`), so both
directions need the base weights of a DoRA's layers.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .adapters import (
    ADAPTER_KEY,
    PEFT_MAGNITUDE_KEY,
    LoHaLayer,
    LoKrLayer,
    adapter_layer,
    dora_scale_from_magnitude,
    magnitude_from_dora_scale,
)
from .formats import AdapterLayer, LoRALayer, LoRAWeights, from_peft_state_dict, is_peft_lora_key

PEFT_ADAPTER = "default"


def is_peft_adapter_key(key: str) -> bool:
    """Whether ``key`` names a trainable weight of a peft LoRA, DoRA, LoHa or LoKr adapter."""
    return is_peft_lora_key(key) or bool(ADAPTER_KEY.match(key) or PEFT_MAGNITUDE_KEY.match(key))


def weights_from_peft(state_dict: Mapping[str, torch.Tensor], alpha: float | None, rank: int | None = None,
                      prefix: str = "", base_weights: Mapping[str, torch.Tensor] | None = None) -> LoRAWeights:
    """The adapter of a peft-injected model's trainable weights, whatever its type.

    Args:
        state_dict: The adapter's weights under peft's names (see the module docstring).
        alpha: peft's alpha (``lora_alpha``); None means alpha equal to the rank.
        rank: peft's ``r``: a LoKr layer of two whole factors does not show it. None reads it from the factors.
        prefix: Removed from each key first (``pipe.dit.``).
        base_weights: The base weights of the DoRA layers, by layer name (needed for DoRA only).

    Raises:
        ValueError: Keys of no adapter, several types, or a DoRA layer without its base weight.
    """
    state = {key.removeprefix(prefix): tensor for key, tensor in state_dict.items()}
    magnitudes, lycoris, plain = {}, {}, {}
    for key, tensor in state.items():
        if match := PEFT_MAGNITUDE_KEY.match(key):
            magnitudes[match["layer"]] = tensor
        elif match := ADAPTER_KEY.match(key):
            lycoris.setdefault(match["layer"], {})[match["part"]] = tensor
        else:
            plain[key] = tensor
    if lycoris:
        if plain or magnitudes:
            raise ValueError(f"the state dict mixes LoHa/LoKr weights with others ({sorted(plain or magnitudes)[:3]})")
        layers = {}
        for name, parts in lycoris.items():
            layer = adapter_layer(parts, None, repr(name))
            layer_rank = rank or layer.rank or 1
            layer.scale = 1.0 if alpha is None else alpha / layer_rank
            layers[name] = layer
        return LoRAWeights(layers)
    weights = from_peft_state_dict(plain, alpha)
    for name, magnitude in magnitudes.items():
        layer = weights.layers.get(name)
        base = (base_weights or {}).get(name)
        if layer is None or base is None:
            raise ValueError(f"DoRA layer {name!r} lacks its LoRA factors or its base weight; a DoRA file needs the "
                             "base weights of its layers")
        layer.dora_scale = dora_scale_from_magnitude(magnitude, layer.delta(), base)
    return weights


def peft_values(weights: LoRAWeights, run_scale: float, base_weights: Mapping[str, torch.Tensor] | None = None,
                adapter: str | None = PEFT_ADAPTER) -> dict[str, torch.Tensor]:
    """The peft weights (``<layer>.<part>[.<adapter>][.weight]``) that make each layer's change at peft's scale
    ``run_scale`` (``alpha / r`` of the run): the file's own scale is folded into ``lora_B``, ``hada_w1_a``,
    ``lokr_w1`` or ``lokr_w1_a``; a DoRA layer's ``dora_scale`` becomes peft's magnitude, from its base weight.

    Raises:
        ValueError: A DoRA layer without its base weight.
    """
    tag = "" if adapter is None else f".{adapter}"
    values = {}
    for name, layer in weights.layers.items():
        rescaled = layer.rescaled(1.0 / run_scale)
        if isinstance(layer, LoRALayer):
            values[f"{name}.lora_A{tag}.weight"] = layer.down.float()
            values[f"{name}.lora_B{tag}.weight"] = rescaled.up.float()
            if layer.dora_scale is not None:
                base = (base_weights or {}).get(name)
                if base is None:
                    raise ValueError(f"DoRA layer {name!r} needs its base weight to become peft's magnitude")
                values[f"{name}.lora_magnitude_vector{tag}.weight"] = magnitude_from_dora_scale(
                    layer.dora_scale, _lora_change(layer), base)
        else:
            values.update({f"{name}.{part}{tag}": tensor.float() for part, tensor in rescaled.factors().items()})
    return values


def _lora_change(layer: LoRALayer) -> torch.Tensor:
    """``scale * up @ down`` of a layer, leaving DoRA's magnitude out."""
    return LoRALayer(layer.down, layer.up, layer.scale).delta()


def layer_structure(layer: AdapterLayer) -> tuple[str, ...]:
    """The names and shapes of a layer's factors, to compare a file with a run's adapter."""
    if isinstance(layer, (LoHaLayer, LoKrLayer)):
        return tuple(f"{part}{tuple(tensor.shape)}" for part, tensor in sorted(layer.factors().items()))
    return (f"lora_A{tuple(layer.down.shape)}", f"lora_B{tuple(layer.up.shape)}")
