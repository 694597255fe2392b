"""Prefetch for ``OffloadTrainingManager``: record the order in which units run, then copy the next ones ahead.

A *pass* is everything between two boundaries: ``after_backward()``, and a forward of the root module that starts
while no backward is awaited (inference) or after the last one ran. Every moment a unit's weights are needed is an
event ``(phase, unit)``, with phase ``forward``, ``recompute`` (a gradient-checkpointed forward inside backward) or
``backward`` (the gradient of the unit's output has arrived); repeats of the same event in a row count once.

- The first pass records its events (the execution order); nothing is prefetched.
- A later pass follows the recorded order: at each event it checks the event is the next recorded one, then starts
  copying the units of the next K distinct recorded events (``depth``) that are not loaded, on the transfer engine.
  Compute waits for a unit's copy (an event on CUDA, nothing on the CPU) only when the unit is needed. A unit the
  manager is done with but that is among those next K (the last units of a forward are the first of its backward)
  is kept loaded instead, as if prefetched: no copy at all.
- When an event differs from the recorded one (a model whose forward branches, a validation pass between steps), the
  pass stops prefetching, unloads what it prefetched and has not used, logs it (the first time), and its whole order
  becomes the recorded one at its end; a pass that ends early counts as a change too.

At most K units are prefetched and not yet used at any moment, so the device holds at most the units the manager
would hold without prefetch plus the K largest units. A prefetched unit's weights are loaded once and kept until
the manager would unload them anyway: under gradient checkpointing that is after the unit's own backward, so a
weight crosses the bus once for its forward and once for its recompute and backward together.

The schedule is the same on every device; only the engine differs: ``DirectEngine`` (a copy stream, events) on CUDA,
``SyncEngine`` (plain copies, at once) on the CPU, where the tests run it. The scheduler alone knows which units are
prefetched and not used yet.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from .transfer import CopyPair, TransferEngine

if TYPE_CHECKING:
    from .leaf_offload import OffloadUnit

logger = logging.getLogger(__name__)

FORWARD, RECOMPUTE, BACKWARD = "forward", "recompute", "backward"
"""The phases of an event: a forward call, a checkpointed forward re-run inside backward, a unit's backward."""

MAX_TRACE_EVENTS = 1 << 16
"""A pass with more events is not recorded (a model whose root is never called has no pass boundary but
``after_backward()``; its trace must not grow for ever); it runs without prefetch."""

Event = tuple[str, int]


@dataclasses.dataclass
class PrefetchStats:
    """Counters since the manager was built.

    Attributes:
        passes: Passes ended (empty ones not counted).
        hits: Loads a unit needed that had already been prefetched.
        misses: Loads a unit needed that were made on the spot (the recording pass, order changes, units that a
            look-ahead skipped because they were loaded then).
        prefetches: Units whose loads were started ahead of use.
        kept: Units kept loaded for their next use instead of unloaded and copied again.
        dropped: Prefetched units unloaded unused (after an order change).
        order_changes: Passes whose order differed from the recorded one.
    """

    passes: int = 0
    hits: int = 0
    misses: int = 0
    prefetches: int = 0
    kept: int = 0
    dropped: int = 0
    order_changes: int = 0


class PrefetchScheduler:
    """Records the units' execution order and prefetches the next ``depth`` units along it.

    Args:
        units: The manager's units; events name them by position.
        depth: K, how many units may be prefetched and not yet used at once (at least 1).
        engine: Copies the prefetched weights: ``submit`` starts them after the compute queued so far, ``wait``
            orders later compute behind them.
        max_events: A pass with more events than this is not recorded; None: ``MAX_TRACE_EVENTS``.
    """

    def __init__(self, units: Sequence[OffloadUnit], depth: int, engine: TransferEngine,
                 max_events: int | None = None) -> None:
        if depth < 1:
            raise ValueError(f"a prefetch scheduler needs depth >= 1, got {depth}")
        self.units = units
        self.depth = depth
        self.engine = engine
        self.stats = PrefetchStats()
        self.recorded: list[Event] | None = None
        self._max_events = max_events if max_events is not None else MAX_TRACE_EVENTS
        self._lookahead = 64 + 16 * depth
        self._index = {id(unit): index for index, unit in enumerate(units)}
        self._current: list[Event] = []
        self._last: Event | None = None
        self._position = 0
        self._following = False
        self._overflowed = False
        self._saw_backward = False
        self._backward_expected = False
        self._prefetched: set[int] = set()
        self._logged_change = self._logged_overflow = False

    # ---- what the manager reports -------------------------------------------------------------------------------

    def demand(self, unit: OffloadUnit, phase: str) -> None:
        """Unit ``unit`` computes now (``phase``): checks the order, loads it (or takes its prefetch), looks ahead."""
        index = self._index[id(unit)]
        event = (phase, index)
        if event != self._last:
            self._last = event
            self._saw_backward |= phase != FORWARD
            self._record(event)
            if self._following:
                if self._position < len(self.recorded) and self.recorded[self._position] == event:
                    self._position += 1
                else:
                    self._order_changed(f"{phase} of {unit.name!r} at event {len(self._current) - 1}", keep=index)
        self._take(unit, index)
        if self._following:
            self._look_ahead(current=index)

    def release(self, unit: OffloadUnit) -> None:
        """The manager is done with ``unit`` for now: keeps it loaded, as a prefetch, when the recorded order needs it
        again among the next K units that hold or need a prefetch slot; unloads it otherwise."""
        index = self._index[id(unit)]
        if self._following and unit.is_loaded and index not in self._prefetched:
            count = len(self._prefetched)
            for other in self._slot_units(also=index):
                if count >= self.depth:
                    break
                if other == index:
                    self._prefetched.add(index)
                    self.stats.kept += 1
                    return
                if other not in self._prefetched:
                    count += 1
        unit.unload()

    def expect_backward(self) -> None:
        """A unit's output needs a gradient: a backward belongs to this pass (it is not forward-only)."""
        self._backward_expected = True

    def at_root_forward(self) -> None:
        """The root module's forward starts (outside backward): maybe a pass boundary, then prefetch its first units.

        The current pass ends here when its backward has run or none is awaited; a second forward before the
        awaited backward (two calls feeding one loss) stays in the pass.
        """
        if (self._current or self._overflowed) and (self._saw_backward or not self._backward_expected):
            self.end_pass()
        if not self._current and self._following:
            self._look_ahead()

    def end_pass(self) -> None:
        """Ends the pass: unloads unused prefetches, and records this pass's order if it was not the recorded one."""
        if not self._current and not self._overflowed:
            self._drop_prefetched()  # a look-ahead at the root's forward may have prefetched, with nothing run since
            return
        if self._following and self._position != len(self.recorded):
            self._order_changed(f"the pass ended after {self._position} of {len(self.recorded)} recorded events")
        self._drop_prefetched()
        if self._overflowed:
            self.recorded = None
        elif not self._following:
            self.recorded = self._current
        self.stats.passes += 1
        self._current = []
        self._last = None
        self._position = 0
        self._following = self.recorded is not None
        self._overflowed = self._saw_backward = self._backward_expected = False

    # ---- inspection ---------------------------------------------------------------------------------------------

    def recorded_order(self) -> list[tuple[str, str]]:
        """The recorded order as ``(phase, unit name)`` pairs; empty before the first pass has ended."""
        return [(phase, self.units[index].name) for phase, index in self.recorded or []]

    @property
    def prefetched_units(self) -> list[str]:
        """Names of the units prefetched and not used yet (at most ``depth``)."""
        return [self.units[index].name for index in sorted(self._prefetched)]

    # ---- internals ----------------------------------------------------------------------------------------------

    def _record(self, event: Event) -> None:
        if self._overflowed:
            return
        if len(self._current) >= self._max_events:
            if not self._logged_overflow:
                logger.info("offload prefetch: a pass ran more than %d unit events without a boundary (no root "
                            "forward, no after_backward()); it is not recorded and runs without prefetch",
                            self._max_events)
            self._logged_overflow = self._overflowed = True
            self._current = []
            self._stop_following()
            return
        self._current.append(event)

    def _take(self, unit: OffloadUnit, index: int) -> None:
        if index in self._prefetched:
            self._prefetched.discard(index)
            self.stats.hits += 1
        elif not unit.is_loaded and unit.offloaded_nbytes:
            self.stats.misses += 1
        unit.load()
        for offloader in unit.offloaders:
            offloader.wait_for_copy()

    def _slot_units(self, also: int | None = None) -> Iterator[int]:
        """Units of the recorded order from the current position, each once, nearest first, that hold a prefetch slot
        (prefetched) or would take one (not loaded, something to copy); ``also``: a loaded unit to include."""
        seen: set[int] = set()
        for _, index in self.recorded[self._position:self._position + self._lookahead]:
            if index not in seen:
                seen.add(index)
                unit = self.units[index]
                if index == also or index in self._prefetched or (not unit.is_loaded and unit.offloaded_nbytes):
                    yield index

    def _look_ahead(self, current: int | None = None) -> None:
        # The unit computing now will be released before its next use, where it may be kept: its slot is reserved.
        count = len(self._prefetched)
        for index in self._slot_units(also=current):
            if count >= self.depth:
                return
            if index == current:
                count += 1
            elif index not in self._prefetched:
                self._prefetch(self.units[index], index)
                count += 1

    def _prefetch(self, unit: OffloadUnit, index: int) -> None:
        copies: list[CopyPair] = []
        queued = unit.load(copies)
        self._prefetched.add(index)
        self.stats.prefetches += 1
        if copies:
            self.engine.submit(index, copies)
            waiter = functools.partial(self.engine.wait, index)
            for offloader in queued:
                offloader.copy_pending = waiter

    def _drop_prefetched(self, keep: int | None = None) -> None:
        for index in sorted(self._prefetched - {keep}):
            self.units[index].unload()  # the offloaders wait for their copies before freeing them
            self.stats.dropped += 1
        self._prefetched &= {keep}

    def _stop_following(self, keep: int | None = None) -> None:
        self._following = False
        self._drop_prefetched(keep)

    def _order_changed(self, where: str, keep: int | None = None) -> None:
        self.stats.order_changes += 1
        level = logging.DEBUG if self._logged_change else logging.INFO
        self._logged_change = True
        logger.log(level, "offload prefetch: the units ran in another order than recorded (%s); prefetch is off for "
                   "the rest of this pass, and this pass's order is recorded instead", where)
        self._stop_following(keep)
