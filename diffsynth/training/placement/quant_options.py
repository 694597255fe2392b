"""``--quant_options``: the reference's flag that quantizes the frozen weights of loaded models.

The value is a semicolon list of ``<model>:<method>[/<excluded layers>]`` entries, e.g.
``Qwen/Qwen-Image-2512:transformer/diffusion_pytorch_model*.safetensors:bitsandbytes_nf4/img_mod.1,proj_out``:
``<model>`` is an entry of ``--model_id_with_origin_paths`` (or a ``--model_paths`` path) copied exactly, the method
follows its last colon, and the comma list after the first ``/`` of the method part names layers kept in full
precision (see ``core.quant``). Everything about the flags is checked before any model loads; the exclusions are
checked on the model's skeleton.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from ...core.loader import ModelConfig
from ...core.quant import QuantConfig, bitsandbytes_available, quantizable_layers
from ..config.errors import split_csv
from ..config.quant_flags import FLAG, packed_releases, parse_quant_options

if TYPE_CHECKING:
    from ..config.model import ModelSection

def _model_string(config: ModelConfig) -> str:
    """How an entry of the model flags names ``config``."""
    if config.path is not None:
        return config.path if isinstance(config.path, str) else ",".join(config.path)
    return f"{config.model_id}:{config.origin_file_pattern}"


def quant_package_problems(quant_options: str | None, model_id_with_origin_paths: str | None = None,
                           model_paths: str | None = None) -> list[str]:
    """The optional package the methods, or a release packed 4-bit among the models, need, when it is missing
    (checked at start-up, not with the flags, so that example commands validate on machines without it)."""
    if bitsandbytes_available():
        return []
    problems = []
    if parse_quant_options(quant_options):
        problems.append(f"{FLAG} {quant_options}: bitsandbytes_nf4 needs bitsandbytes, which is not installed; pip "
                        "install -c constraints.txt bitsandbytes, or drop the flag")
    problems += [f"{release} is packed in bitsandbytes' 4-bit layout, which needs bitsandbytes to load; it is not "
                 "installed: pip install -c constraints.txt bitsandbytes, or load a bf16 release"
                 for release in packed_releases(model_id_with_origin_paths, model_paths)]
    return problems


def quant_model_problems(model: ModelSection, trainable: Sequence[str], configs: Sequence[ModelConfig],
                         slots: Mapping[str, ModelConfig], trains: bool,
                         skeletons: Mapping[str, torch.nn.Module]) -> list[str]:
    """The entries must name loaded models that stay frozen and are not fp8, and their exclusions real layers.

    Args:
        model: The run's model flags (``--quant_options``, ``--fp8_models``).
        trainable: The models ``--trainable_models`` trains in full.
        configs: The loaded models' configs.
        slots: The pipeline slot of each config whose model class the pipeline knows.
        trains: Whether this stage trains (stage 1 trains nothing, so any model may be quantized there).
        skeletons: Weightless builds of the quantized models, for the exclusions.
    """
    options = parse_quant_options(model.quant_options)
    loaded = {_model_string(config) for config in configs}
    problems = [f"{FLAG} entry {model!r} is not among the models loaded; copy it exactly from "
                "--model_id_with_origin_paths (or --model_paths)" for model in options if model not in loaded]
    named = quantized_models(model.quant_options, slots)
    full = [slot for slot in named if slot in trainable]
    if trains and full:
        problems.append(f"{FLAG} quantizes {full}, which --trainable_models trains in full; 4-bit storage is for "
                        "frozen weights: drop one of the two (a LoRA on a quantized model trains)")
    fp8 = [slot for slot, config in slots.items() if slot in named and model.fp8_models
           and _model_string(config) in split_csv(model.fp8_models)]
    if fp8:
        problems.append(f"{FLAG} and --fp8_models both name {fp8}; store each model one way")
    for slot, skeleton in skeletons.items():
        if slot in named:
            try:
                quantizable_layers(skeleton, named[slot])
            except ValueError as error:
                problems.append(f"{FLAG} for {slot}: {error}")
    return problems


def quantized_models(quant_options: str | None, model_configs: Mapping[str, ModelConfig]) -> dict[str, QuantConfig]:
    """The pipeline slots (of ``model_configs``: slot -> config) ``--quant_options`` names, with their configs."""
    options = parse_quant_options(quant_options)
    return {slot: options[_model_string(config)] for slot, config in model_configs.items()
            if _model_string(config) in options}
