"""Autograd helpers the offloaders share: the moment a module's input gradients are complete, and recompute detection.

A module's backward has no hook that fires once all of its input gradients exist when its inputs arrive as keyword
arguments or when it is not a leaf. Routing the inputs through an identity autograd function gives that moment
exactly: the function's backward runs after every gradient flowing into the inputs has been computed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch


class UnitBoundary(torch.autograd.Function):
    """Identity on a unit's inputs whose backward runs once the unit's input gradients are complete."""

    @staticmethod
    def forward(ctx: Any, on_backward_done: Any, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.on_backward_done = on_backward_done
        return tensors

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        ctx.on_backward_done()
        return (None, *grads)


def wrap_inputs(on_backward_done: Callable[[], None], args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Routes the inputs that need gradients through one ``UnitBoundary`` calling ``on_backward_done``.

    Returns:
        The forward-pre-hook result ``(args, kwargs)`` with those inputs replaced, or None when no input needs a
        gradient (then there is no moment to mark, and nothing is wrapped).
    """
    positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    keys = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor) and v.requires_grad]
    if not positions and not keys:
        return None
    wrapped = UnitBoundary.apply(on_backward_done, *[args[i] for i in positions], *[kwargs[k] for k in keys])
    args, kwargs = list(args), dict(kwargs)
    for i, tensor in zip(positions, wrapped):
        args[i] = tensor
    for key, tensor in zip(keys, wrapped[len(positions):]):
        kwargs[key] = tensor
    return tuple(args), kwargs


def iter_tensors(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor inside ``value``: nested lists, tuples, dicts and dataclasses (model outputs)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from iter_tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from iter_tensors(item)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for item in dataclasses.fields(value):
            yield from iter_tensors(getattr(value, item.name))


def inside_backward() -> bool:
    """Whether autograd is running a backward pass now (a forward here is a checkpoint recompute)."""
    return torch._C._current_graph_task_id() != -1
