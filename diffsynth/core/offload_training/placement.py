"""Which modules become offload units, and which tensors each unit loads.

A unit is a module whose forward call brackets the use of its tensors: they are loaded just before the call and
unloaded after it (and again around its backward). By default every leaf module with parameters or buffers is a unit
holding its own tensors, and a non-leaf module that holds tensors directly (orphans) is a unit holding just those.

With a split threshold, a module whose whole subtree holds at most that many bytes becomes one unit holding the whole
subtree (fewer, larger transfers); larger modules are split into their children. Containers without a ``forward`` of
their own (``ModuleList``) are never units, and modules with both ``encode`` and ``decode`` (VAEs, whose ``forward``
is usually not what runs) are always split.

A module whose ``forward`` reads a child's tensor outside the child's own call (``WHOLE_UNIT_CLASSES``) is always one
unit with its whole subtree, since the child's tensors are only on the device while a unit runs.

Tensors whose nearest callable owner does not exist (held directly by a root that is never called) cannot be
bracketed by hooks; they are reported as ``resident`` and stay on the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .memory_buffer import tensor_nbytes

WHOLE_UNIT_CLASSES = frozenset({
    "CLIPTextEmbeddings",  # checks the prompt's length against position_embedding.weight before embedding it
})


@dataclass
class UnitSpec:
    """A planned unit: the module whose calls bracket it, and the tensors it loads."""

    name: str
    module: torch.nn.Module
    params: list[torch.nn.Parameter] = field(default_factory=list)
    buffers: list[tuple[torch.nn.Module, str]] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.params and not self.buffers


@dataclass
class Placement:
    units: list[UnitSpec]
    resident: UnitSpec


def has_own_forward(module: torch.nn.Module) -> bool:
    """Whether calling the module does something (containers such as ``ModuleList`` raise)."""
    return type(module).forward is not torch.nn.Module.forward


def must_split(module: torch.nn.Module) -> bool:
    """Modules that a split threshold never keeps whole."""
    is_codec = callable(getattr(module, "encode", None)) and callable(getattr(module, "decode", None))
    return not has_own_forward(module) or is_codec


def subtree_nbytes(module: torch.nn.Module) -> int:
    """Bytes of all parameters and buffers under ``module``, shared tensors once."""
    return sum(tensor_nbytes(t) for t in {id(t): t for t in [*module.parameters(), *module.buffers()]}.values())


def _add_direct_tensors(spec: UnitSpec, module: torch.nn.Module) -> None:
    spec.params.extend(p for p in module._parameters.values() if p is not None)
    spec.buffers.extend((module, name) for name, b in module._buffers.items() if b is not None)


def plan_units(model: torch.nn.Module, split_threshold_bytes: int | None = None) -> Placement:
    """Plans the offload units of ``model``.

    Args:
        model: The model to offload.
        split_threshold_bytes: Keep modules up to this size whole; None for one unit per leaf module.

    Returns:
        The units in module order, and the tensors that no unit can bracket.
    """
    units: dict[int, UnitSpec] = {}
    resident = UnitSpec("<resident>", model)

    def owner_spec(name: str, module: torch.nn.Module) -> UnitSpec:
        return units.setdefault(id(module), UnitSpec(name, module))

    def visit(name: str, module: torch.nn.Module, owner: tuple[str, torch.nn.Module] | None) -> None:
        callable_module = has_own_forward(module) and not must_split(module)
        if callable_module:
            owner = (name, module)
        children = list(module.named_children())
        keep_whole = callable_module and (type(module).__name__ in WHOLE_UNIT_CLASSES or (
            split_threshold_bytes is not None and 0 < subtree_nbytes(module) <= split_threshold_bytes))
        if keep_whole:
            spec = owner_spec(name, module)
            for submodule in module.modules():
                _add_direct_tensors(spec, submodule)
            return
        if not children and callable_module:
            _add_direct_tensors(owner_spec(name, module), module)
            return
        direct = UnitSpec(name, module)
        _add_direct_tensors(direct, module)
        if not direct.is_empty:
            target = owner_spec(*owner) if owner is not None else resident
            target.params.extend(direct.params)
            target.buffers.extend(direct.buffers)
        for child_name, child in children:
            if id(child) not in visited:
                visited.add(id(child))
                visit(f"{name}.{child_name}" if name else child_name, child, owner)

    visited: set[int] = set()
    visit("", model, None)
    return Placement([spec for spec in units.values() if not spec.is_empty], resident)
