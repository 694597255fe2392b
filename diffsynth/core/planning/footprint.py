"""What one training step of a model saves for backward and computes, found without weights: a dry run on meta.

The planner builds the model on the meta device (shapes and dtypes, no memory), runs one forward and backward at
the run's shape there, and reads two things:

- the bytes autograd saves for backward (``SavedTensorMeter``: every storage once, weights left out since they are
  planned separately), in total at the end of the forward and per block while each block runs;
- the floating-point operations of the step, recomputation included (torch's ``FlopCounterMode``).

The same ``SavedTensorMeter`` measures a real step on the CPU in the tests, so the prediction is checked against
what autograd really keeps. On the meta device torch would compute attention the unfused way and save the full
attention matrix, which no GPU run keeps: ``fused_attention`` computes ``scaled_dot_product_attention`` with the fused
(flash) kernel, whose saved tensors (queries, keys, values, output, log-sum-exp) are those of the fused kernels
that CUDA runs, and whose FLOPs are counted with torch's own attention formulas.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Self

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from ..offload_training.hooks import inside_backward

aten = torch.ops.aten


def storage_key(tensor: torch.Tensor) -> int:
    """Identifies a tensor's storage, shared by its views, on every device (meta tensors have no address)."""
    return tensor.untyped_storage()._cdata


class SavedTensorMeter:
    """Counts the bytes autograd saves for backward while active (a ``with`` block), each storage once.

    Args:
        exclude: Tensors whose storages are not counted (the model's parameters: weights are planned on their own).
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._excluded = {storage_key(tensor) for tensor in exclude}
        self._seen: set[int] = set()
        self.bytes = 0
        self.largest = 0
        self._context = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        key = storage_key(tensor)
        if key not in self._excluded and key not in self._seen:
            self._seen.add(key)
            self.bytes += tensor.untyped_storage().nbytes()
            self.largest = max(self.largest, tensor.untyped_storage().nbytes())
        return tensor

    def __enter__(self) -> Self:
        self._context.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._context.__exit__(*exc)


def fused_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
                    scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    """``scaled_dot_product_attention`` computed by the fused flash kernel, on any device (see the module doc)."""
    if enable_gqa:
        return _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=True)
    if attn_mask is not None and attn_mask.dtype == torch.bool:  # the kernel takes an additive mask, as SDPA passes
        attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype, device=attn_mask.device).masked_fill(
            ~attn_mask, float("-inf"))
    output, _ = aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal,
                                                                 attn_mask=attn_mask, scale=scale)
    return output


_sdpa = F.scaled_dot_product_attention


@contextlib.contextmanager
def fused_attention_everywhere() -> Iterator[None]:
    """Makes ``F.scaled_dot_product_attention`` the fused kernel while active.

    A replaced function rather than a ``TorchFunctionMode``: modes are not active when autograd recomputes a
    checkpointed block inside backward, and the recompute must save what the forward saved.
    """
    F.scaled_dot_product_attention = fused_attention
    try:
        yield
    finally:
        F.scaled_dot_product_attention = _sdpa


class _MetaAutocast(torch.autocast):
    """``torch.autocast`` that takes ``device_type="meta"`` as the CPU's: torch refuses an autocast context on the meta
    device, which a model entering one on its tensors' device (ERNIE-Image's rotary embedding turns autocast off)
    would meet in a dry run."""

    def __init__(self, device_type: str, *args: Any, **kwargs: Any) -> None:
        super().__init__("cpu" if device_type == "meta" else device_type, *args, **kwargs)


@contextlib.contextmanager
def meta_autocast() -> Iterator[None]:
    """Makes ``torch.autocast`` accept the meta device while active (a dry run's forward and backward)."""
    original = torch.autocast
    torch.autocast = _MetaAutocast
    try:
        yield
    finally:
        torch.autocast = original


def _attention_flops(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return sdpa_flop_count(query, key, value)


def _attention_backward_flops(grad: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None,
                              **kwargs: Any) -> int:
    return sdpa_backward_flop_count(grad, query, key, value)


FLOP_FORMULAS = {aten._scaled_dot_product_flash_attention_for_cpu: _attention_flops,
                 aten._scaled_dot_product_flash_attention_for_cpu_backward: _attention_backward_flops}
"""The fused CPU attention kernels' FLOPs, which torch's counter does not know, by its formulas for the CUDA ones."""


@dataclasses.dataclass
class StepFootprint:
    """What one training step keeps and computes.

    Attributes:
        saved_bytes: Bytes autograd holds for backward at the end of the forward (weights excluded).
        block_saved_bytes: Per block, the bytes its forward saved (0 under checkpointing, which saves the inputs
            outside the block); the recompute of a checkpointed block saves what an unchecked one does.
        block_input_bytes: Per block, the bytes of its tensor inputs that need a gradient (what checkpointing keeps
            and activation offload moves to the host).
        flops: Floating-point operations of forward and backward, recomputation included.
        largest_saved_bytes: The largest single tensor saved (a gradient of its size is made in backward).
    """

    saved_bytes: int
    block_saved_bytes: list[int]
    block_input_bytes: list[int]
    flops: int
    largest_saved_bytes: int = 0


def measure_step(model: torch.nn.Module, step: Callable[[], torch.Tensor],
                 blocks: Iterable[torch.nn.Module] = (), fused_attention: bool = True) -> StepFootprint:
    """Runs ``step`` (a forward returning the loss) and its backward, measuring saved bytes and FLOPs.

    Works on any device; on the meta device it is a prediction that costs no memory (and seconds, for 20B models).

    Args:
        model: The model (its parameters are left out of the saved bytes).
        step: Runs the forward and returns a scalar loss.
        blocks: The blocks to report per block (a transformer's blocks, every list block swap manages).
        fused_attention: Compute attention with the fused kernel (``fused_attention``); the meta device needs it.
    """
    blocks = list(blocks)
    saved = [0] * len(blocks)
    inputs = [0] * len(blocks)
    meter = SavedTensorMeter(model.parameters())
    handles = []
    for index, block in enumerate(blocks):
        def before(module: Any, args: tuple, kwargs: dict, index: int = index) -> None:
            if not inside_backward():
                saved[index] -= meter.bytes
                inputs[index] += sum(t.untyped_storage().nbytes() for t in [*args, *kwargs.values()]
                                     if isinstance(t, torch.Tensor) and t.requires_grad)

        def after(module: Any, args: tuple, output: Any, index: int = index) -> None:
            if not inside_backward():
                saved[index] += meter.bytes

        handles += [block.register_forward_pre_hook(before, with_kwargs=True), block.register_forward_hook(after)]
    counter = FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS)
    try:
        with counter, meta_autocast(), (fused_attention_everywhere() if fused_attention else contextlib.nullcontext()):
            with meter:
                loss = step()
            loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    return StepFootprint(meter.bytes, saved, inputs, counter.get_total_flops(), meter.largest)

