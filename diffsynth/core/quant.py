"""4-bit NF4 storage of frozen Linear weights through bitsandbytes (the reference's ``bitsandbytes_nf4`` method).

``quantize_model(model, QuantConfig("bitsandbytes_nf4", exclude))`` replaces every frozen ``torch.nn.Linear`` of
``model`` (peft's ``base_layer`` included, its adapters not) by a ``bitsandbytes.nn.Linear4bit`` whose weight is
packed to 4 bits per value, NormalFloat4 with one absmax per block of 64 (itself quantized), and dequantized to the
layer's dtype inside each call: about 0.56 bytes per weight against 2 for bf16, for a larger error than fp8 (about
9% relative per weight against 2.5%). Excluded layers keep their weights in full precision; an entry matches a layer
whose dotted name equals it or ends with ``.`` + it (``img_mod.1`` matches ``transformer_blocks.0.img_mod.1``), as
in the reference. A LoRA injected on a quantized layer trains in float32 on top of it.

bitsandbytes is optional (``pip install bitsandbytes``); 0.50 quantizes, runs and back-propagates NF4 layers on the
CPU too (slower than on a GPU: its CPU kernels are generic). Weights quantize on the device they are on.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Sequence
from typing import Any

import torch

from .fp8 import linear_slots

QUANT_METHODS = {"bitsandbytes_nf4": "4-bit NormalFloat weights (bitsandbytes), computed in the model's dtype"}


def bitsandbytes_available() -> bool:
    """Whether ``bitsandbytes`` can be imported."""
    return importlib.util.find_spec("bitsandbytes") is not None


def require_bitsandbytes(method: str) -> Any:
    """Imports bitsandbytes for ``method``.

    Raises:
        ImportError: It is not installed; the message says how to install it.
    """
    if not bitsandbytes_available():
        raise ImportError(f"quantization method {method} needs bitsandbytes, which is not installed; pip install "
                          "-c constraints.txt bitsandbytes, or train without it")
    import bitsandbytes

    return bitsandbytes


@dataclasses.dataclass
class QuantConfig:
    """How one model's frozen Linear weights are quantized, checked at construction.

    Args:
        method: One of :data:`QUANT_METHODS`.
        exclude: Layers kept in full precision, by dotted name or name suffix.
    """

    method: str
    exclude: Sequence[str] = ()

    def __post_init__(self) -> None:
        if self.method not in QUANT_METHODS:
            known = ", ".join(f"{name} ({what})" for name, what in QUANT_METHODS.items())
            raise ValueError(f"quantization method {self.method!r} is unknown; the known methods are: {known}")
        if isinstance(self.exclude, str):
            raise ValueError(f"exclude={self.exclude!r} must be a list of layer names, e.g. [{self.exclude!r}]")
        self.exclude = tuple(self.exclude)
        bad = [e for e in self.exclude if not isinstance(e, str) or not e or e.startswith(".") or e.endswith(".")]
        if bad:
            raise ValueError(f"exclude entries {bad} must be dotted layer names such as 'proj_out' or 'img_mod.1'")

    def excludes(self, name: str) -> bool:
        """Whether the layer ``name`` stays in full precision."""
        return any(_matches(name, entry) for entry in self.exclude)


def _matches(name: str, entry: str) -> bool:
    return name == entry or name.endswith(f".{entry}")


@dataclasses.dataclass
class QuantStorage:
    """What :func:`quantize_model` did: the quantized layers and their weight bytes before and after."""

    layer_names: list[str]
    bytes_before: int
    bytes_after: int

    def summary(self) -> str:
        mib = 1024 * 1024
        return (f"nf4: {len(self.layer_names)} Linear layers, weights {self.bytes_before / mib:.2f} MiB -> "
                f"{self.bytes_after / mib:.2f} MiB ({self.bytes_after / max(self.bytes_before, 1):.0%})")


def _layer_name(name: str) -> str:
    """A slot's name as the model's layer name (peft's ``.base_layer`` dropped), for exclusion matching."""
    return name[: -len(".base_layer")] if name.endswith(".base_layer") else name


def quantizable_layers(model: torch.nn.Module, config: QuantConfig) -> list[str]:
    """The Linear layers ``config`` would quantize (names without peft's ``.base_layer``).

    Works on a model built without weights, so a trainer checks the exclusions before loading anything.

    Raises:
        ValueError: An exclude entry matches no Linear layer, or none is left to quantize.
    """
    names = [_layer_name(name) for name, *_ in linear_slots(model)]
    unmatched = [entry for entry in config.exclude if not any(_matches(name, entry) for name in names)]
    if unmatched:
        raise ValueError(f"exclude entries {unmatched} match no Linear layer of {type(model).__name__}; name layers "
                         f"by their dotted path or its end, e.g. {names[:2]}")
    kept = [name for name in names if not config.excludes(name)]
    if not kept:
        raise ValueError(f"{type(model).__name__} has no Linear layer left to quantize ({len(names)} found, all "
                         "excluded)")
    return kept


def empty_linear4bit(linear: torch.nn.Linear, compute_dtype: torch.dtype) -> torch.nn.Module:
    """A ``bitsandbytes.nn.Linear4bit`` (NF4) of ``linear``'s sizes and bias on the meta device, computing in
    ``compute_dtype``: its weight is then set, quantized here or read packed from a file (``loader.nf4_layout``)."""
    import bitsandbytes as bnb

    layer = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                              compute_dtype=compute_dtype, quant_type="nf4", device="meta")
    # On a CPU with AVX512-BF16, bitsandbytes repacks the weight in place for its inference kernel at the first
    # eval-mode call without gradients (rounding the block scales to bf16, and only for widths that are multiples
    # of 64); training keeps the standard layout, which every later call and backward reads.
    layer.support_avx512bf16_for_cpu = False
    return layer.train(linear.training)


def quantize_model(model: torch.nn.Module, config: QuantConfig) -> QuantStorage:
    """Quantizes the frozen Linear weights of ``model`` in place (see the module docstring).

    Raises:
        ImportError: bitsandbytes is not installed.
        ValueError: See :func:`quantizable_layers`; also a trainable Linear weight among those to quantize.
    """
    bnb = require_bitsandbytes(config.method)
    quantizable_layers(model, config)
    slots = [(name, parent, attribute, linear) for name, parent, attribute, linear in linear_slots(model)
             if not config.excludes(_layer_name(name)) and not isinstance(linear, bnb.nn.Linear4bit)]
    trainable = [name for name, *_, linear in slots if linear.weight.requires_grad]
    if trainable:
        raise ValueError(f"the weights of {trainable[:4]} are trainable; 4-bit storage is for frozen weights, so "
                         "exclude them or freeze them")
    before = after = 0
    for name, parent, attribute, linear in slots:
        weight = linear.weight.detach()
        layer = empty_linear4bit(linear, weight.dtype)
        # Params4bit packs the weight when it is moved to a device, its current one included.
        layer.weight = bnb.nn.Params4bit(weight.contiguous(), requires_grad=False, quant_type="nf4").to(weight.device)
        layer.bias = linear.bias
        setattr(parent, attribute, layer.train(linear.training))
        state = layer.weight.quant_state
        before += weight.numel() * weight.element_size()
        after += layer.weight.numel() + state.absmax.numel() * state.absmax.element_size()
    return QuantStorage([_layer_name(name) for name, *_ in slots], before, after)
