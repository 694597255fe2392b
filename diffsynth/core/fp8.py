"""fp8 storage of frozen ``torch.nn.Linear`` weights: half the bytes of bf16 (a quarter of fp32), held and moved.

``enable_fp8_storage(model)`` replaces every frozen Linear layer of ``model`` by an :class:`Fp8Linear` that keeps its
weight as ``torch.float8_e4m3fn`` plus a per-row scale, and builds the weight in the compute dtype inside each call.
The model then holds half the weight bytes of a bf16 model, and an ``OffloadTrainingManager`` moves half the bytes
per step. The price: one elementwise up-cast of each weight per call (and again in backward), and precision.

Scaling. e4m3fn has 3 mantissa bits and a range of +-448, so a plain cast clips large weights and flushes weights
below about 2e-3 to zero (Linear weights of width 3072 are around 1e-2). Each output row is therefore stored as
``weight_fp8 = weight / scale`` with ``scale = amax(|row|) / 448`` (``per_channel=False``: one amax for the whole
tensor), which uses the whole range of the format whatever the weights' magnitude; what remains is the rounding to 3
mantissa bits. Measured relative error ``||W_fp8 - W|| / ||W||`` (bf16 for comparison: 0.17%): 2.6% on
``randn(256, 256)``; 2.6% on a default-initialised 3072x3072 Linear (plain unscaled cast: 5.4%); 2.5% on ``to_q`` of a
tiny ``QwenImageTransformer2DModel`` (at most 2.55% over all its Linear layers, and Wan's); 2.6% on ``randn * 1e-4``
(plain cast: 100%, everything flushed to zero). On the output of a whole tiny float32 Qwen-Image / Wan transformer:
3.4% / 2.5%, and 3.6% / 2.6% with a bf16 model (bf16 alone: 0.6% / 0.6%), checked in ``tests/core/test_fp8.py``.
Per-channel scales cost ``out_features`` numbers per layer (0.1% of a 3072-wide layer) and keep rows of small
weights accurate next to a row of outliers. Train LoRAs on an fp8 base, evaluate them on the full-precision one.

The scale is stored in the layer's dtype (bf16 for a bf16 model) and the weight is quantized with the scale as
stored, so its rounding costs nothing. Nothing computes in fp8: the up-cast multiplies by the scale in the compute
dtype (the input's dtype, the autocast dtype under ``torch.autocast``, or ``compute_dtype``) and the matmul runs in
that dtype. A custom autograd function saves the fp8 weight, not its up-cast copy, for backward and rebuilds the
up-cast there: autograd holds one byte per weight until backward instead of two, and an offload manager recognises
the saved tensor as the weight it loaded, so nothing of the layer stays on the device between forward and backward.
Under gradient checkpointing the up-cast simply runs again inside the recomputed forward.

``state_dict()`` of a converted layer holds ``weight_scale`` (layer dtype, ``(out_features, 1)``, or ``(1, 1)`` per
tensor), ``weight`` as float8_e4m3fn of the original shape, and ``bias`` as before; safetensors stores all three.
Loading a full-precision ``weight`` into an :class:`Fp8Linear` quantizes it on the way in. ``model.to(dtype)``
casts scales and biases but only moves the fp8 weights (a cast would silently drop the scale).

Order: convert before or after injecting a peft LoRA; both give the same model. Adapter layers of peft tuner layers
are never converted (they train); only their ``base_layer``. Also left as they are: the ``out_proj`` of
``torch.nn.MultiheadAttention`` (read directly, not called) and Linear weights tied to an embedding (kept in full
there anyway). Convert before building an ``OffloadTrainingManager``
(it swaps weights for placeholders and hooks the modules it saw). Not supported on fp8 layers: merging a LoRA into
them (peft would merge without the scale: ``remove()`` first), diffusers' ``fuse_projections``, DoRA, code that
casts a layer's input to ``layer.weight.dtype`` (refused at the call: exclude that layer), and Conv layers (they
stay in their dtype).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.autograd.function import once_differentiable

FP8_MAX = 448.0
"""Largest finite ``float8_e4m3fn`` value: each scale maps a row's largest magnitude onto it."""
_HIGH_PRECISION = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def fp8_dtype() -> torch.dtype:
    """``torch.float8_e4m3fn``, checked to exist and convert on this torch build.

    Raises:
        RuntimeError: This torch has no float8 support (it needs torch >= 2.1).
    """
    dtype = getattr(torch, "float8_e4m3fn", None)
    if dtype is None:
        raise RuntimeError(f"fp8 storage needs torch.float8_e4m3fn, which torch {torch.__version__} lacks; install "
                           "torch >= 2.1, or train without fp8 storage")
    try:
        torch.zeros(1).to(dtype)
    except (RuntimeError, TypeError) as error:
        raise RuntimeError(f"torch {torch.__version__} cannot convert to float8_e4m3fn ({error}); use another "
                           "torch build, or train without fp8 storage") from None
    return dtype


def quantize_fp8(weight: torch.Tensor, per_channel: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Splits a 2-D weight into ``(weight_fp8, scale)`` with ``weight ~= weight_fp8 * scale``.

    Args:
        weight: A ``(out_features, in_features)`` float16 / bfloat16 / float32 weight.
        per_channel: One scale per output row (default), else one for the whole tensor.

    Returns:
        The float8_e4m3fn tensor, and the scale in the weight's dtype, ``(out_features, 1)`` or ``(1, 1)``.
    """
    w = weight.detach().float()
    amax = w.abs().amax(dim=1, keepdim=True) if per_channel else w.abs().amax().reshape(1, 1)
    # An all-zero row has no amax; any scale keeps it zero, and 1 keeps the division finite.
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax)).to(weight.dtype)
    # In float16 the scale of a row of tiny weights can underflow to zero; its smallest normal keeps it invertible.
    scale = torch.where(scale > 0, scale, torch.full_like(scale, torch.finfo(scale.dtype).tiny))
    # Quantizing with the scale as stored (already rounded to the weight's dtype) makes that rounding cost nothing;
    # the division can then land just above 448, which e4m3fn cannot hold.
    return (w / scale.float()).clamp_(-FP8_MAX, FP8_MAX).to(fp8_dtype()), scale


def dequantize_fp8(weight_fp8: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Builds ``weight_fp8 * scale`` in ``dtype`` (one temporary of the weight's size in that dtype)."""
    return weight_fp8.to(dtype).mul_(scale.to(dtype))


class _Fp8LinearFunction(torch.autograd.Function):
    """``F.linear`` with an fp8 weight that saves the fp8 weight, not its up-cast copy, for backward."""

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, weight_fp8: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(weight_fp8, scale)
        ctx.input_dtype = input.dtype
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return torch.nn.functional.linear(input, dequantize_fp8(weight_fp8, scale, dtype), bias)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_input = grad_bias = None
        if ctx.needs_input_grad[0]:
            weight_fp8, scale = ctx.saved_tensors
            weight = dequantize_fp8(weight_fp8, scale, grad_output.dtype)
            grad_input = grad_output.matmul(weight).to(ctx.input_dtype)
        if ctx.needs_input_grad[3]:
            grad_bias = grad_output.reshape(-1, grad_output.shape[-1]).sum(0).to(ctx.bias_dtype)
        return grad_input, None, None, grad_bias, None


class Fp8Linear(torch.nn.Linear):
    """A Linear layer whose frozen weight is stored in float8_e4m3fn, with a scale in the layer's dtype.

    It subclasses ``torch.nn.Linear`` so that peft (which picks its LoRA layer by ``isinstance``) and diffusers treat
    it as one. ``weight_scale`` and ``weight`` are frozen parameters (not buffers: an offload manager writes
    persistent buffers of training modules back to the host after every use, parameters it does not), registered
    in that order so that code which takes a model's dtype from its first parameter (diffusers' ``ModelMixin.dtype``,
    Wan's time embedder casting its input) sees the layer's dtype, not float8. ``bias`` is kept as it was and may
    train. ``compute_dtype`` is also the attribute peft reads to choose the dtype of LoRA layers injected on top
    (None: peft leaves them as created, float32).

    Args:
        weight_fp8: The ``(out_features, in_features)`` float8_e4m3fn weight.
        weight_scale: Its scale, ``(out_features, 1)`` or ``(1, 1)``; its dtype is the layer's dtype.
        bias: The bias parameter, or None.
        compute_dtype: Dtype of the up-cast weight and the matmul; None follows the input (or autocast).
    """

    def __init__(self, weight_fp8: torch.Tensor, weight_scale: torch.Tensor, bias: torch.nn.Parameter | None = None,
                 compute_dtype: torch.dtype | None = None) -> None:
        # Skips Linear.__init__, which would allocate and randomly initialise a full-precision weight.
        torch.nn.Module.__init__(self)
        if weight_fp8.dim() != 2 or weight_fp8.dtype != fp8_dtype():
            raise ValueError(f"weight_fp8 must be a 2-D float8_e4m3fn tensor, got {weight_fp8.dtype} "
                             f"{tuple(weight_fp8.shape)}; build the layer with Fp8Linear.from_linear(linear)")
        self.out_features, self.in_features = weight_fp8.shape
        if tuple(weight_scale.shape) not in ((self.out_features, 1), (1, 1)):
            raise ValueError(f"weight_scale has shape {tuple(weight_scale.shape)}; it must be ({self.out_features}, "
                             "1) per channel or (1, 1) per tensor, as quantize_fp8 returns")
        self.weight_scale = torch.nn.Parameter(weight_scale, requires_grad=False)
        self.weight = torch.nn.Parameter(weight_fp8, requires_grad=False)
        self.bias = bias
        self.compute_dtype = compute_dtype
        self.per_channel = weight_scale.shape[0] == self.out_features

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, compute_dtype: torch.dtype | None = None,
                    per_channel: bool = True) -> Fp8Linear:
        """Quantizes a frozen Linear layer; its bias parameter is shared, not copied."""
        weight_fp8, scale = quantize_fp8(linear.weight, per_channel)
        return cls(weight_fp8, scale, linear.bias, compute_dtype).train(linear.training)

    def to_linear(self, dtype: torch.dtype | None = None) -> torch.nn.Linear:
        """A plain frozen Linear with the dequantized weight in ``dtype`` (default: the layer's dtype).

        Lossy: the fp8 rounding stays in the weight; reload the checkpoint for the exact original weights.
        """
        dtype = dtype or self.weight_scale.dtype
        linear = torch.nn.utils.skip_init(torch.nn.Linear, self.in_features, self.out_features, bias=False,
                                          device=self.weight.device, dtype=dtype)
        weight = dequantize_fp8(self.weight.detach(), self.weight_scale.detach(), dtype)
        linear.weight = torch.nn.Parameter(weight, requires_grad=False)
        linear.bias = self.bias
        return linear.train(self.training)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.weight.requires_grad or self.weight_scale.requires_grad:
            raise RuntimeError("an Fp8Linear weight was made trainable (requires_grad_(True) on the model?); fp8 "
                               "weights are frozen storage. Freeze them again, or call Fp8Storage.remove() before "
                               "training these layers in full")
        if input.dtype == self.weight.dtype:
            raise RuntimeError("an Fp8Linear got a float8 input: the calling code cast it to the layer's weight dtype, "
                               "which loses most of its precision. Keep that layer in its dtype with "
                               "enable_fp8_storage(..., exclude=[its name]) (see the traceback for the caller)")
        if self.compute_dtype is not None:
            input = input.to(self.compute_dtype)
        device_type = input.device.type
        if device_type != "meta" and torch.is_autocast_enabled(device_type):  # meta: the planner's dry run
            # Up-cast straight to the autocast dtype; F.linear would otherwise cast the up-cast weight a second time.
            dtype = torch.get_autocast_dtype(device_type)
        else:
            dtype = input.dtype
        bias = self.bias
        if bias is not None and bias.dtype != dtype:
            bias = bias.to(dtype)
        return _Fp8LinearFunction.apply(input, self.weight, self.weight_scale, bias, dtype)

    def _apply(self, fn: Any, recurse: bool = True) -> Fp8Linear:
        def keep_fp8(tensor: torch.Tensor) -> torch.Tensor:
            applied = fn(tensor)
            # model.to(torch.bfloat16) must not cast the fp8 weight (that would be a plain cast without its scale):
            # it only moves. The scale and bias follow the cast like any parameter of the layer.
            if tensor is self.weight and applied.dtype != tensor.dtype:
                return tensor.to(device=applied.device)
            return applied

        return super()._apply(keep_fp8, recurse)

    def quantize_weight(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weight_fp8, scale)`` of a full-precision weight for this layer, as loading one stores it."""
        # At the layer's dtype, as a plain Linear would cast it, instead of casting to fp8 without a scale.
        return quantize_fp8(weight.to(self.weight_scale.dtype), self.per_channel)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        weight = state_dict.get(prefix + "weight")
        if isinstance(weight, torch.Tensor) and weight.dtype in _HIGH_PRECISION:  # a full-precision checkpoint
            state_dict[prefix + "weight"], state_dict[prefix + "weight_scale"] = self.quantize_weight(weight)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        scale = "per-channel" if self.per_channel else "per-tensor"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"storage=float8_e4m3fn ({scale} scale), compute_dtype={self.compute_dtype}")


@dataclasses.dataclass
class Fp8StorageConfig:
    """What ``enable_fp8_storage`` converts, checked at construction.

    Args:
        compute_dtype: Dtype of the up-cast weights and the matmuls; None (default) follows each input.
        exclude: Layers to keep in their dtype: an entry excludes every Linear whose dotted name contains it as
            whole components (``"proj_out"``, ``"to_q"``, ``"transformer_blocks.0"``).
        per_channel: One scale per output row (default), else one per tensor.
    """

    compute_dtype: torch.dtype | None = None
    exclude: Sequence[str] = ()
    per_channel: bool = True

    def __post_init__(self) -> None:
        if self.compute_dtype is not None and self.compute_dtype not in _HIGH_PRECISION:
            raise ValueError(f"compute_dtype={self.compute_dtype!r} must be None (follow the input) or one of "
                             f"{[str(d) for d in _HIGH_PRECISION]}, e.g. torch.bfloat16; nothing computes in fp8")
        if isinstance(self.exclude, str):
            raise ValueError(f"exclude={self.exclude!r} must be a list of layer names, e.g. [{self.exclude!r}]")
        self.exclude = tuple(self.exclude)
        bad = [e for e in self.exclude if not isinstance(e, str) or not e or e.startswith(".") or e.endswith(".")]
        if bad:
            raise ValueError(f"exclude entries {bad} must be dotted module names such as 'proj_out' or "
                             "'transformer_blocks.0.attn'")
        if not isinstance(self.per_channel, bool):
            raise ValueError(f"per_channel={self.per_channel!r} must be True (a scale per row) or False (per tensor)")

    def excludes(self, name: str) -> bool:
        return any(f".{entry}." in f".{name}." for entry in self.exclude)


@dataclasses.dataclass
class Fp8Storage:
    """What ``enable_fp8_storage`` did: the converted layers and their weight bytes before and after.

    Attributes:
        module: The converted model.
        config: The checked configuration.
        layer_names: Dotted names of the converted layers (peft's ``.base_layer`` included where there is one).
        bytes_before: Bytes of those layers' weights before conversion.
        bytes_after: Bytes of their fp8 weights and scales (biases are not counted: they do not change).
        kind: ``"Linear"`` (``enable_fp8_storage``) or ``"convolution"`` (``fp8_conv.enable_fp8_conv_storage``).
    """

    module: torch.nn.Module
    config: Fp8StorageConfig
    layer_names: list[str]
    bytes_before: int
    bytes_after: int
    kind: str = "Linear"

    @property
    def saved_bytes(self) -> int:
        return self.bytes_before - self.bytes_after

    def summary(self) -> str:
        """One line for the log: how many layers, and their weight bytes before and after."""
        mib = 1024 * 1024
        return (f"fp8 storage: {len(self.layer_names)} {self.kind} layers, weights {self.bytes_before / mib:.2f} "
                f"MiB -> {self.bytes_after / mib:.2f} MiB ({self.bytes_after / max(self.bytes_before, 1):.0%})")

    def remove(self, dtype: torch.dtype | None = None) -> int:
        """Turns every layer of this kind that is stored in fp8 back into a plain one; returns how many.

        Lossy: weights come back dequantized (the fp8 rounding stays). Remove an offload manager first.

        Args:
            dtype: The weights' dtype; default, each layer's dtype before conversion.
        """
        if self.kind == "convolution":
            from .fp8_conv import is_fp8_conv, restore_conv

            converted = [module for module in self.module.modules() if is_fp8_conv(module)]
            for conv in converted:
                restore_conv(conv, dtype)
            return len(converted)
        count = 0
        for parent in self.module.modules():
            for name, child in list(parent.named_children()):
                if isinstance(child, Fp8Linear):
                    setattr(parent, name, child.to_linear(dtype))
                    count += 1
        return count


def nbytes_by_dtype(module: torch.nn.Module) -> dict[torch.dtype, int]:
    """Bytes of a module's parameters and buffers per dtype, each shared tensor once (storage before/after)."""
    tensors = {id(t): t for t in [*module.parameters(), *module.buffers()]}.values()
    totals: dict[torch.dtype, int] = {}
    for tensor in tensors:
        totals[tensor.dtype] = totals.get(tensor.dtype, 0) + tensor.numel() * tensor.element_size()
    return totals


def linear_slots(module: torch.nn.Module, prefix: str = "") -> Iterator[tuple[str, torch.nn.Module, str, Any]]:
    """Yields ``(name, parent, attribute, layer)`` for every Linear below ``module``, LoRA adapters skipped."""
    if isinstance(module, torch.nn.MultiheadAttention):
        return  # its forward reads out_proj.weight directly, bypassing any Linear forward
    base_layer = getattr(module, "base_layer", None)
    # A peft tuner layer: only its base layer holds frozen model weights; lora_A / lora_B are what trains.
    children = [("base_layer", base_layer)] if isinstance(base_layer, torch.nn.Module) else module.named_children()
    for attribute, child in children:
        name = f"{prefix}.{attribute}" if prefix else attribute
        if isinstance(child, torch.nn.Linear):
            yield name, module, attribute, child
        else:
            yield from linear_slots(child, name)


def _check_convertible(name: str, linear: torch.nn.Linear) -> None:
    weight = linear.weight
    if weight.dtype not in _HIGH_PRECISION:
        raise ValueError(f"{name}.weight is {weight.dtype}; fp8 storage converts float16/bfloat16/float32 weights "
                         "only. Add it to exclude")
    if tuple(weight.shape) != (linear.out_features, linear.in_features):
        raise ValueError(f"{name}.weight has shape {tuple(weight.shape)}, not ({linear.out_features}, "
                         f"{linear.in_features}): an offload manager holds it? Call enable_fp8_storage before "
                         "building the OffloadTrainingManager (or after manager.remove())")
    if linear._forward_hooks or linear._forward_pre_hooks:
        raise ValueError(f"{name} has forward hooks (an offload or accelerate hook?), which would be lost when the "
                         "layer is replaced; call enable_fp8_storage before installing them")
    if not weight.is_meta and not torch.isfinite(weight).all():  # a weightless build (the planner's) has no values
        raise ValueError(f"{name}.weight holds inf or NaN values, which have no fp8 scale; fix the checkpoint or "
                         "add the layer to exclude")


def enable_fp8_storage(module: torch.nn.Module, compute_dtype: torch.dtype | None = None,
                       exclude: Sequence[str] = (), per_channel: bool = True) -> Fp8Storage:
    """Stores the frozen Linear weights of ``module`` in float8_e4m3fn, up-cast per call (in place).

    Halves weight memory and offload traffic against bf16 (quarters them against fp32) for an elementwise up-cast
    per layer call and about 2.5% relative error per weight (see the module docstring).

    Args:
        module: The model; every ``torch.nn.Linear`` below it is converted (peft LoRA adapters excepted).
        compute_dtype: Dtype of the up-cast weights; None (default) follows each input (or autocast).
        exclude: Layers kept in their dtype, by dotted name components (``"proj_out"``, ``"blocks.0"``).
        per_channel: One scale per output row (default) rather than one per tensor.

    Returns:
        The :class:`Fp8Storage` handle: converted layer names, bytes before and after, ``remove()``.

    Raises:
        RuntimeError: This torch build has no float8 support.
        ValueError: A bad option, an exclude entry that matches no layer, a trainable Linear weight (fp8 is for
            frozen weights; trainable ones stay in their dtype), no Linear layer to convert, or a layer already
            managed by an offload manager or hooks.
    """
    config = Fp8StorageConfig(compute_dtype, exclude, per_channel)
    fp8_dtype()
    owner = type(module).__name__
    if isinstance(module, torch.nn.Linear):
        raise ValueError(f"enable_fp8_storage got a bare {owner}, which cannot replace itself; pass the model that "
                         "contains it, or use Fp8Linear.from_linear(layer)")
    slots: dict[int, list[tuple[str, torch.nn.Module, str]]] = {}
    layers: dict[int, torch.nn.Linear] = {}
    names: list[str] = []
    already_fp8 = 0
    # A weight tied to a non-Linear owner (an embedding) would stay alive there in full: converting saves nothing.
    tied = {id(p) for m in module.modules() if not isinstance(m, torch.nn.Linear) for p in m._parameters.values()}
    for name, parent, attribute, linear in linear_slots(module):
        names.append(name)
        if isinstance(linear, Fp8Linear):
            already_fp8 += 1
        elif not config.excludes(name) and id(linear.weight) not in tied:
            layers[id(linear)] = linear
            slots.setdefault(id(linear), []).append((name, parent, attribute))
    unmatched = [entry for entry in config.exclude if not any(f".{entry}." in f".{n}." for n in names)]
    if unmatched:
        raise ValueError(f"exclude entries {unmatched} match no Linear layer of {owner}; name layers by dotted "
                         f"components of their path, e.g. {names[:2]}")
    if not names:
        raise ValueError(f"{owner} has no torch.nn.Linear layer; fp8 storage converts Linear weights only")
    if not layers:
        reasons = [f"{already_fp8} are fp8 already (enable_fp8_storage ran before)"] if already_fp8 else []
        if len(names) > already_fp8:
            reasons.append(f"exclude={list(config.exclude)} keeps the other {len(names) - already_fp8}")
        raise ValueError(f"{owner} has no Linear layer left to convert: {'; '.join(reasons)}")
    trainable = [slots[key][0][0] for key, linear in layers.items() if linear.weight.requires_grad]
    if trainable:
        raise ValueError(f"the weights of {len(trainable)} Linear layer(s) of {owner} are trainable ({trainable[:4]}"
                         f"{' ...' if len(trainable) > 4 else ''}); fp8 storage is for frozen weights, trainable "
                         "ones stay in their dtype. Freeze them (requires_grad_(False)) or pass them in exclude")
    for key, linear in layers.items():
        _check_convertible(slots[key][0][0], linear)
    bytes_before = bytes_after = 0
    converted: list[str] = []
    for key, linear in layers.items():
        fp8_layer = Fp8Linear.from_linear(linear, config.compute_dtype, config.per_channel)
        bytes_before += linear.weight.numel() * linear.weight.element_size()
        bytes_after += sum(t.numel() * t.element_size() for t in (fp8_layer.weight, fp8_layer.weight_scale))
        for name, parent, attribute in slots[key]:
            setattr(parent, attribute, fp8_layer)
            converted.append(name)
    return Fp8Storage(module, config, converted, bytes_before, bytes_after)


def store_model_in_fp8(model: torch.nn.Module) -> list[str]:
    """Stores a frozen model's Linear and convolution weights in fp8 (in place); returns a summary line per kind.

    What the model class keeps in float32 (``_keep_in_fp32_modules``) stays out, since its code casts inputs to those
    layers' weight dtype (UMT5's ``wo``), as do the layers its family registers
    (``model_traits.input_casting_layers``); so do embeddings,
    norms and biases (small, or read by index). Works on a model built on the meta device too, as the shared loader
    converts it before its weights exist.
    """
    from .fp8_conv import CONV_TYPES, enable_fp8_conv_storage
    from .model_traits import input_casting_layers

    modules = dict(model.named_modules())
    keep = (*(getattr(model, "_keep_in_fp32_modules", None) or ()),
            *input_casting_layers(type(model).__name__))
    summaries = []
    for kinds, enable in ((torch.nn.Linear, enable_fp8_storage), (CONV_TYPES, enable_fp8_conv_storage)):
        paths = [f".{path}." for path, module in modules.items() if isinstance(module, kinds)]
        if paths:
            exclude = [entry for entry in keep if any(f".{entry}." in path for path in paths)]
            summaries.append(enable(model, exclude=exclude).summary())
    return summaries


def holds_fp8_layers(module: torch.nn.Module) -> bool:
    """Whether ``module`` already stores weights in fp8 (converted while loading, for a shared host copy)."""
    from .fp8_conv import is_fp8_conv

    return any(isinstance(child, Fp8Linear) or is_fp8_conv(child) for child in module.modules())
