"""The offload manager's policy: every unit (a leaf module by default) is on the device only while it computes.

A unit is loaded for its forward, its recompute and its backward, and released after each (a recompute whose outputs
need no gradient has no backward: it is released at once); a unit whose inputs need no gradient but whose outputs do
has no moment that ends its backward and stays loaded until ``end_pass()``. With a prefetch scheduler
(``prefetch.py``) loads and releases go through it: it copies the next K units of the recorded order ahead and keeps
a released unit loaded when it is among them.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from .hooks import ResidencyPolicy
from .offloader import TensorOffloader
from .prefetch import BACKWARD, FORWARD, RECOMPUTE, PrefetchScheduler
from .transfer import CopyPair


class OffloadUnit:
    """Runtime state of one unit: its offloaders and whether they are loaded."""

    def __init__(self, name: str, module: nn.Module, offloaders: list[TensorOffloader]) -> None:
        self.name = name
        self.module = module
        self.offloaders = offloaders
        self.offloaded_nbytes = sum(o.nbytes for o in offloaders if o.counts_toward_residency)
        self.is_loaded = False
        self.loaded_until_after_backward = False

    def load(self, deferred: list[CopyPair] | None = None) -> list[TensorOffloader]:
        """Loads every tensor (a no-op when loaded); with ``deferred``, queues the copies there (see ``onload``) and
        returns the offloaders that queued one."""
        if self.is_loaded:
            return []
        self.is_loaded = True
        if deferred is None:
            for offloader in self.offloaders:
                offloader.onload()
            return []
        return [offloader for offloader in self.offloaders if offloader.onload(deferred)]

    def unload(self) -> None:
        if self.is_loaded:
            self.is_loaded = False
            for offloader in self.offloaders:
                offloader.offload()


class LeafOffloadPolicy(ResidencyPolicy):
    """Loads each unit around its forward, recompute and backward; prefetches along the recorded order if asked.

    Args:
        units: The units, in the driver's order.
        prefetch: The scheduler over ``units``; None loads every unit on the spot.
    """

    wants_backward_start = True

    def __init__(self, units: Sequence[OffloadUnit], prefetch: PrefetchScheduler | None = None) -> None:
        self.units = units
        self.prefetch = prefetch

    def on_pass_start(self) -> None:
        if self.prefetch is not None:
            self.prefetch.at_root_forward()

    def before_forward(self, unit: int, needs_backward: bool, checkpointed: bool) -> None:
        self._demand(unit, FORWARD)

    def before_recompute(self, unit: int) -> None:
        self._demand(unit, RECOMPUTE)

    def on_backward_start(self, unit: int) -> None:
        self._demand(unit, BACKWARD)

    def after_forward(self, unit: int, needs_backward: bool, bounded: bool) -> None:
        if needs_backward and not bounded:
            self.units[unit].loaded_until_after_backward = True
        if needs_backward and self.prefetch is not None:
            self.prefetch.expect_backward()
        self._release(unit)

    def after_recompute(self, unit: int, needs_backward: bool) -> None:
        if not needs_backward:
            self._release(unit)  # no backward will release it: its outputs need no gradient

    def on_backward_done(self, unit: int) -> None:
        if not self.units[unit].loaded_until_after_backward:
            self._release(unit)

    def end_pass(self) -> None:
        """Ends a backward pass: drops unused prefetches and unloads every unit."""
        if self.prefetch is not None:
            self.prefetch.end_pass()
        for unit in self.units:
            unit.loaded_until_after_backward = False
            unit.unload()

    def _demand(self, unit: int, phase: str) -> None:
        if self.prefetch is None:
            self.units[unit].load()
        else:
            self.prefetch.demand(self.units[unit], phase)

    def _release(self, unit: int) -> None:
        if self.prefetch is None:
            self.units[unit].unload()
        else:
            self.prefetch.release(self.units[unit])
