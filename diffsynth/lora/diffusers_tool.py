"""diffusers' LoRA loading, as :mod:`.tools` emulates it: the family's ``LoraLoaderMixin.lora_state_dict`` (real code)
converts the file, then ``load_lora_adapter``'s rules apply: the keys of the denoiser's component (``transformer.``, or
``unet.`` for the UNet pipelines, whose loaders also return kohya's alphas beside the factors), converted to peft's
names when the first is not, with the scale from ``lora_adapter_metadata``, the network alphas, or alpha = rank.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import torch

from .formats import LoRALayer


def diffusers_layers(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str], model: Any
                     ) -> tuple[dict[str, LoRALayer], list[str]]:
    """What diffusers' ``load_lora_weights`` applies to the denoiser of ``model`` (``tools._Model``): ``({diffusers
    layer name: layer}, the file's keys it leaves unused)``."""
    import diffusers.loaders.lora_pipeline as lora_pipeline

    mixin = getattr(lora_pipeline, model.tools.diffusers_loader) if model.tools else None
    if mixin is None:
        raise ValueError(f"no diffusers LoRA loader is known for {model.class_name}")
    converted = mixin.lora_state_dict({key: value.clone() for key, value in tensors.items()})
    # The UNet pipelines' loaders return the kohya alphas beside the factors, and keep the denoiser under "unet."
    converted, alphas = converted if isinstance(converted, tuple) else (converted, None)
    component = getattr(mixin, "transformer_name", None) or mixin.unet_name
    config = {}
    raw = metadata.get("lora_adapter_metadata")
    if raw:  # load_lora_adapter builds peft's LoraConfig from the component's entries
        config = {key.removeprefix(f"{component}."): value for key, value in json.loads(raw).items()
                  if key.startswith(f"{component}.")}
    alphas = {key: float(value) for key, value in (alphas or {}).items() if key.startswith(f"{component}.")}
    if alphas:  # peft's get_peft_kwargs: one alpha for all when they agree, else a pattern by the key's stem
        if len(set(alphas.values())) == 1:
            config["lora_alpha"] = next(iter(alphas.values()))
        else:
            config["alpha_pattern"] = {key.removeprefix(f"{component}.").split(".lora")[0]: value
                                       for key, value in alphas.items()}
    factors: dict[str, dict[str, torch.Tensor]] = {}
    unloaded = [key for key in converted if not key.startswith(f"{component}.")]
    ours = {key.removeprefix(f"{component}."): tensor for key, tensor in converted.items()
            if key.startswith(f"{component}.")}
    if ours and "lora_A" not in next(iter(ours)):  # load_lora_adapter's test of the first key, then its conversion
        from diffusers.utils import convert_unet_state_dict_to_peft

        ours = convert_unet_state_dict_to_peft(ours)
    for key, tensor in ours.items():
        match = re.match(r"^(?P<module>.+)\.lora_(?P<part>[AB])\.weight$", key)
        if match is None:
            unloaded.append(key)
            continue
        factors.setdefault(match["module"], {})[match["part"]] = tensor
    applied = {}
    for module, parts in factors.items():
        if set(parts) != {"A", "B"}:
            unloaded.append(module)
            continue
        rank = parts["A"].shape[0]
        alpha = float(config.get("alpha_pattern", {}).get(module, config.get("lora_alpha", rank)))
        applied[module] = LoRALayer(parts["A"], parts["B"], alpha / rank)
    return applied, unloaded
