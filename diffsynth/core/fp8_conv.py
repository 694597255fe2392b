"""fp8 storage of frozen convolution weights (``Conv1d`` / ``Conv2d`` / ``Conv3d`` and their subclasses).

Convolutional models (the VAEs, the transformers' patch embeddings, Qwen2.5-VL's vision patch embedding) often
subclass the torch layer and add to its ``forward`` (a causal VAE pads in time before calling the parent's), so a
converted layer keeps its object and its class's code: :func:`store_conv_in_fp8` moves the instance to a subclass of
its own class whose ``weight`` attribute builds the weight in the layer's dtype on each read, from the fp8 tensor and
its per-output-channel scale held in ``_parameters`` (``weight`` as float8_e4m3fn, ``weight_scale`` in the layer's
dtype, as :class:`~diffsynth.core.fp8.Fp8Linear` stores them). Every reader of ``self.weight`` (the convolution
itself, and code that casts its input to ``self.weight.dtype``) therefore sees a weight in the model's dtype, so
nothing computes in fp8 and no input is cast to it. The price: one elementwise up-cast of the weight per read, and
while the input needs a gradient, autograd keeps that up-cast copy until backward (the models converted here are
frozen encoders and patch embeddings, whose inputs rarely need one).

The scale is per output channel over the rest of the kernel, as for Linear rows; the measured error is the same
(about 2.5% relative per weight, see ``fp8.py``). ``state_dict()`` holds ``weight`` (fp8, original shape) and
``weight_scale`` (``(out_channels, 1, ...)``); loading a full-precision ``weight`` quantizes it on the way in.
``model.to(dtype)`` casts the scale but only moves the fp8 weight.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .fp8 import _HIGH_PRECISION, Fp8Storage, Fp8StorageConfig, dequantize_fp8, fp8_dtype, quantize_fp8

CONV_TYPES = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)


def quantize_conv_weight(weight: torch.Tensor, per_channel: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Splits a convolution weight into ``(weight_fp8, scale)``, one scale per output channel (or one in all)."""
    flat_fp8, scale = quantize_fp8(weight.reshape(weight.shape[0], -1), per_channel)
    broadcast = (scale.shape[0],) + (1,) * (weight.dim() - 1)
    return flat_fp8.reshape(weight.shape), scale.reshape(broadcast)


class Fp8ConvMixin:
    """What a converted convolution adds to its own class: ``weight`` read as the up-cast weight, fp8-aware
    ``_apply`` and state-dict loading. Never instantiated directly (see :func:`store_conv_in_fp8`)."""

    @property
    def weight(self) -> torch.Tensor:
        stored = self._parameters["weight"]
        if stored.requires_grad or self._parameters["weight_scale"].requires_grad:
            raise RuntimeError("an fp8 convolution weight was made trainable (requires_grad_(True) on the model?); "
                               "fp8 weights are frozen storage. Freeze them again, or leave the model out of "
                               "--fp8_models to train it in full")
        scale = self._parameters["weight_scale"]
        return dequantize_fp8(stored, scale, scale.dtype)

    def _apply(self, fn: Any, recurse: bool = True) -> torch.nn.Module:
        stored = self._parameters["weight"]

        def keep_fp8(tensor: torch.Tensor) -> torch.Tensor:
            applied = fn(tensor)
            # A dtype cast of the model must not cast the fp8 weight without its scale: it only moves.
            if tensor is stored and applied.dtype != tensor.dtype:
                return tensor.to(device=applied.device)
            return applied

        return super()._apply(keep_fp8, recurse)

    def quantize_weight(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weight_fp8, scale)`` of a full-precision weight for this layer, as loading one stores it."""
        scale = self._parameters["weight_scale"]
        per_channel = scale.shape[0] != 1 or self.out_channels == 1
        return quantize_conv_weight(weight.to(scale.dtype), per_channel)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        weight = state_dict.get(prefix + "weight")
        if isinstance(weight, torch.Tensor) and weight.dtype in _HIGH_PRECISION:
            state_dict[prefix + "weight"], state_dict[prefix + "weight_scale"] = self.quantize_weight(weight)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


_FP8_CLASSES: dict[type, type] = {}


def _fp8_class(cls: type) -> type:
    """The fp8 subclass of a convolution class, made once per class (so converted layers of a class share it)."""
    if cls not in _FP8_CLASSES:
        _FP8_CLASSES[cls] = type(f"Fp8{cls.__name__}", (Fp8ConvMixin, cls), {"__module__": cls.__module__})
    return _FP8_CLASSES[cls]


def is_fp8_conv(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a convolution whose weight :func:`store_conv_in_fp8` converted."""
    return isinstance(module, Fp8ConvMixin)


def restore_conv(conv: torch.nn.Module, dtype: torch.dtype | None = None) -> None:
    """Turns a converted convolution back into its own class with a plain weight (dequantized: the fp8 rounding
    stays), in place; ``dtype`` defaults to the scale's."""
    scale = conv._parameters.pop("weight_scale")
    stored = conv._parameters.pop("weight")
    bias = conv._parameters.pop("bias", None)
    conv.__class__ = type(conv).__mro__[2]  # Fp8<Class> -> (Fp8ConvMixin, <Class>)
    weight = dequantize_fp8(stored.detach(), scale.detach(), dtype or scale.dtype)
    conv._parameters["weight"] = torch.nn.Parameter(weight, requires_grad=False)
    conv._parameters["bias"] = bias


def _check_convertible(conv: torch.nn.Module) -> None:
    if not isinstance(conv, CONV_TYPES) or is_fp8_conv(conv):
        raise ValueError(f"{type(conv).__name__} is not an unconverted Conv1d/2d/3d layer")
    weight = conv._parameters["weight"]
    if weight.requires_grad:
        raise ValueError("its weight is trainable; fp8 storage is for frozen weights. Freeze it or exclude it")
    if weight.dtype not in _HIGH_PRECISION:
        raise ValueError(f"its weight is {weight.dtype}; fp8 storage converts float weights only. Exclude it")
    if not weight.is_meta and not torch.isfinite(weight).all():  # a weightless build (the shared loader's) has none
        raise ValueError("its weight holds inf or NaN values, which have no fp8 scale; fix the checkpoint or "
                         "exclude it")


def store_conv_in_fp8(conv: torch.nn.Module, per_channel: bool = True) -> tuple[int, int]:
    """Stores a frozen convolution's weight in float8_e4m3fn with its scale, in place (the object is kept).

    Returns:
        The weight's bytes before and after (fp8 weight plus scale).

    Raises:
        ValueError: Not a convolution, already converted, a trainable or non-float weight, or non-finite values.
    """
    _check_convertible(conv)
    fp8_dtype()
    weight = conv._parameters["weight"]
    weight_fp8, scale = quantize_conv_weight(weight.detach(), per_channel)
    bias = conv._parameters.pop("bias", None)
    del conv._parameters["weight"]
    # The scale first: code that takes a model's dtype from its first parameter must not see float8.
    conv.register_parameter("weight_scale", torch.nn.Parameter(scale, requires_grad=False))
    conv._parameters["weight"] = torch.nn.Parameter(weight_fp8, requires_grad=False)
    conv._parameters["bias"] = bias
    conv.__class__ = _fp8_class(type(conv))
    before = weight.numel() * weight.element_size()
    return before, weight_fp8.numel() * weight_fp8.element_size() + scale.numel() * scale.element_size()


def enable_fp8_conv_storage(module: torch.nn.Module, exclude: Sequence[str] = (),
                            per_channel: bool = True) -> Fp8Storage:
    """Stores the frozen convolution weights of ``module`` in float8_e4m3fn (in place); see the module docstring.

    peft's adapter layers (``lora_A`` / ``lora_B``) are left as they are: they train.

    Args:
        module: The model.
        exclude: Layers kept in their dtype, by dotted name components, as for ``enable_fp8_storage``.
        per_channel: One scale per output channel (default) rather than one per tensor.

    Returns:
        The :class:`~diffsynth.core.fp8.Fp8Storage` handle (``kind="convolution"``).

    Raises:
        ValueError: A bad option, an exclude entry that matches no convolution, no convolution left to convert, or
            a trainable, non-float or non-finite convolution weight.
    """
    config = Fp8StorageConfig(exclude=exclude, per_channel=per_channel)
    owner = type(module).__name__
    convs = {name: conv for name, conv in module.named_modules()
             if isinstance(conv, CONV_TYPES) and not {"lora_A", "lora_B"} & set(name.split("."))}
    unmatched = [entry for entry in config.exclude if not any(config.excludes(name) for name in convs)]
    if unmatched:
        raise ValueError(f"exclude entries {unmatched} match no convolution of {owner}; name layers by dotted "
                         f"components of their path, e.g. {list(convs)[:2]}")
    todo = {name: conv for name, conv in convs.items() if not config.excludes(name) and not is_fp8_conv(conv)}
    if not todo:
        raise ValueError(f"{owner} has no convolution layer left to convert ({len(convs)} found, all excluded or "
                         "already in fp8)")
    for name, conv in todo.items():  # every layer is checked before any changes
        try:
            _check_convertible(conv)
        except ValueError as error:
            raise ValueError(f"convolution {name} of {owner}: {error}") from None
    bytes_before = bytes_after = 0
    for conv in todo.values():
        before, after = store_conv_in_fp8(conv, per_channel)
        bytes_before, bytes_after = bytes_before + before, bytes_after + after
    return Fp8Storage(module, config, list(todo), bytes_before, bytes_after, kind="convolution")
