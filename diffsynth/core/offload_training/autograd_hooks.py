"""Autograd helpers the offloaders share: the moment a module's input gradients are complete, and recompute detection.

A module's backward has no hook that fires once all of its input gradients exist when its inputs arrive as keyword
arguments or when it is not a leaf. Routing the inputs through an identity autograd function gives that moment
exactly: the function's backward runs after every gradient flowing into the inputs has been computed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
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
