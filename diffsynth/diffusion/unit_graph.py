"""The unit-graph split behind two-stage ("split") training.

Stage 1 (``sft:data_process``) runs the units that do not depend on a trained model once per sample and caches the
state they leave; stage 2 (``sft:train``) starts every step from that cache and runs the remaining units. The split
reads only the units' declarations (``pipeline_unit.py``).

State keys. A key is ``(scope, name)`` with scope ``shared``, ``posi`` or ``nega``: a plain unit reads and writes
``shared``; a ``separate_cfg`` unit reads ``shared`` (its ``input_params`` and ``cfg_scale``, which the runner
consults), ``posi`` and ``nega``, and writes its outputs to ``posi`` and ``nega``. A ``take_over`` unit is declared
conservatively: every name it declares is read in all three scopes and every output is written in all three. A write
that may not happen is modelled as a read plus a write ("the new value is a function of the old one"), which is
sound, whereas a declared write that silently does not happen could hide the real producer of a value. Every unit is
assumed to compute its outputs from what it reads and from frozen weights only; a unit that draws random numbers
(initial noise) is cached with its first draw, so losses should draw their own noise.

The algorithm. Units ``u_1 .. u_n`` run in order; a final reader ``u_{n+1}`` stands for whatever reads the state
after the last unit (the loss, via ``final_keys``) and is always in stage 2. ``X_0`` holds the units whose
``onload_model_names`` meet the trained models. The related set (stage 2) is the least fixed point above ``X_0`` of
``T(X) = X | F(X) | U(X) | P(X)`` where, with ``w(u, k)`` the latest writer of key ``k`` before ``u``:

- F (forward): a unit that reads ``k`` from ``w(u, k)`` in ``X`` is in ``T(X)``;
- U (later updates): every writer of ``k`` after some unit of ``X`` that reads ``k`` is in ``T(X)``;
- P (shadowed producer): if ``u`` in ``X`` reads ``k`` and some unit of ``X`` writes ``k`` before ``u``, then
  ``w(u, k)`` is in ``T(X)``.

F and the seed's update-chain rule are the published algorithm, whose U fires only when the first related reader of
``k`` also writes ``k``. That misses two cases, both of which put a wrong value in front of a stage-2 unit:

1. a related unit reads ``k`` and a model-free unit overwrites ``k`` later: stage 1 runs the overwrite, the cache
   holds the new value, and stage 2 reads it too early. Our U fires for any related reader.
2. a related unit writes ``k``, a model-free unit overwrites it, and a related unit reads it: stage 2 re-runs the
   first write over the cached value. P moves the overwrite into stage 2.

Why the result is exact. Induct along the full order; a unit's outputs depend only on what it reads. A stage-1 unit
``v`` reading ``k``: by F its producer ``w(v, k)`` is not related, so it is the latest stage-1 writer before ``v``
and stage 1 gives ``v`` the full-run value. A stage-2 unit (or the final reader) ``u`` reading ``k``: if ``w(u, k)``
is related, it is the latest stage-2 writer before ``u``. Otherwise P says no related unit writes ``k`` before ``u``,
so ``u`` reads the cached ``k``, i.e. the last stage-1 writer of ``k``; U says every writer after ``u`` is related,
so that last stage-1 writer is ``w(u, k)`` itself (or nobody, and the cache holds the initial value). Either way
``u`` reads the full-run value.

How small it is. T is monotone, so its least fixed point ``X*`` is unique, no order of evaluation changes it, and
``X*`` is the smallest set containing ``X_0`` that is closed under F, U and P. It satisfies the seed's conditions C1
(no stage-1 unit reads a stage-2 output; that is F) and C2 (update chains; our U implies it). F and P are forced: any
exact split that contains their premises contains their conclusion. U is needed only when the related reader takes
its value from the cache; when that value's producer is related too, a later overwrite that no stage-2 unit reads
could stay in stage 1. Firing U only in that case would make T non-monotone (whether the producer ends up related is
known only at the end), so the result would depend on evaluation order and C2 would no longer hold. We keep U
unconditional and accept the spare unit: on random unit graphs one or two splits in a hundred are one unit larger
than the smallest exact split. The other way to satisfy U, moving the value's producer into stage 2, would re-run
pre-processing (text or VAE encoding) at every training step, which split training exists to avoid.

Cache pruning. ``stage_one_units`` ends stage 1 with a ``PruneCacheUnit`` keeping only the keys stage 2 reads before
writing them, plus the final reader's; that is the whole cache the training stage needs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from .pipeline_unit import SCOPES, PipelineUnit

StateKey = tuple[str, str]


@dataclasses.dataclass(frozen=True)
class UnitAccess:
    """The state keys one unit reads and writes, as the split sees them."""

    reads: frozenset[StateKey]
    writes: frozenset[StateKey]


def unit_access(unit: PipelineUnit) -> UnitAccess:
    """Translates a unit's declarations into ``(scope, name)`` keys; see the module docstring for the rules."""
    if unit.take_over:
        names = {*unit.fetch_input_params(), *unit.output_params}
        reads = {(scope, name) for scope in SCOPES for name in names}
        writes = {(scope, name) for scope in SCOPES for name in unit.output_params}
    elif unit.separate_cfg:
        reads = {("shared", name) for name in (*unit.input_params, "cfg_scale")}
        reads |= {("posi", key) for key in unit.input_params_posi.values()}
        reads |= {("nega", key) for key in unit.input_params_nega.values()}
        writes = {(scope, name) for scope in ("posi", "nega") for name in unit.output_params}
    else:
        reads = {("shared", name) for name in unit.input_params}
        writes = {("shared", name) for name in unit.output_params}
    return UnitAccess(frozenset(reads), frozenset(writes))


def expand_keys(keys: Iterable[str | StateKey], argument: str = "keys") -> frozenset[StateKey]:
    """Turns names into state keys: a bare name stands for that name in all three scopes.

    Raises:
        TypeError: ``keys`` is a bare string, which would be read as its characters.
        ValueError: An entry is neither a name nor a ``(scope, name)`` pair with a known scope.
    """
    if isinstance(keys, str):
        raise TypeError(f"{argument}={keys!r} is a string; pass a tuple of names, e.g. {argument}=({keys!r},)")
    expanded: set[StateKey] = set()
    for key in keys:
        if isinstance(key, str):
            expanded.update((scope, key) for scope in SCOPES)
        elif isinstance(key, tuple) and len(key) == 2 and key[0] in SCOPES and isinstance(key[1], str):
            expanded.add(key)
        else:
            raise ValueError(f"{argument} holds {key!r}; use a name or a (scope, name) pair with scope in {SCOPES}")
    return frozenset(expanded)


def _directly_related(units: Sequence[PipelineUnit], model_names: Iterable[str]) -> set[int]:
    if isinstance(model_names, str):
        raise TypeError(f"model_names={model_names!r} is a string; pass a list, e.g. [{model_names!r}]")
    wanted = set(model_names)
    return {index for index, unit in enumerate(units) if wanted.intersection(unit.onload_model_names)}


def _related_closure(accesses: Sequence[UnitAccess], start: set[int]) -> set[int]:
    """The least fixed point of T above ``start``; the last access is the final reader and always included."""
    count = len(accesses)
    writers: dict[StateKey, list[int]] = {}
    for index, access in enumerate(accesses):
        for key in access.writes:
            writers.setdefault(key, []).append(index)

    def latest_writer(key: StateKey, before: int) -> int | None:
        earlier = [index for index in writers.get(key, ()) if index < before]
        return earlier[-1] if earlier else None

    # producer[v][k]: the unit whose value of k unit v reads (None: the initial value).
    producer = [{key: latest_writer(key, index) for key in access.reads} for index, access in enumerate(accesses)]
    related = set(start) | {count - 1}
    while True:
        grown = set(related)
        for index in range(count):  # F
            if index not in related and any(source in related for source in producer[index].values()):
                grown.add(index)
        for index in related:
            for key, source in producer[index].items():
                grown.update(writer for writer in writers.get(key, ()) if writer > index)  # U
                if source is not None and any(writer in related for writer in writers[key] if writer < index):
                    grown.add(source)  # P
        if grown == related:
            return related
        related = grown


def split_pipeline_units(units: Sequence[PipelineUnit], model_names: Iterable[str],
                         final_keys: Iterable[str | StateKey] = ()) -> tuple[list[PipelineUnit], list[PipelineUnit]]:
    """Splits units into the ones that depend on the trained models and the ones that do not.

    Running the unrelated units in order, then the related units in order from the state that leaves, gives every
    unit exactly the values it reads in a full run (see the module docstring for the rules and the proof).

    Args:
        units: The pipeline's units, in run order.
        model_names: The models that receive gradients (trained fully or through LoRA), e.g. ``["dit"]``.
        final_keys: Keys read after the last unit (by the loss); their final values are kept exact too. A bare name
            means that name in every scope. Pass the same value when building stage 1 and stage 2.

    Returns:
        ``(related, unrelated)``, each in the original order: stage 2 and stage 1.
    """
    accesses = [unit_access(unit) for unit in units]
    final_reader = UnitAccess(expand_keys(final_keys, "final_keys"), frozenset())
    related = _related_closure([*accesses, final_reader], _directly_related(units, model_names))
    return ([unit for index, unit in enumerate(units) if index in related],
            [unit for index, unit in enumerate(units) if index not in related])


def required_cache_keys(related_units: Sequence[PipelineUnit],
                        final_keys: Iterable[str | StateKey] = ()) -> frozenset[StateKey]:
    """The keys stage 2 takes from the cache: read by a related unit (or the final reader) before any writes it."""
    written: set[StateKey] = set()
    needed: set[StateKey] = set()
    for access in [*map(unit_access, related_units), UnitAccess(expand_keys(final_keys, "final_keys"), frozenset())]:
        needed |= access.reads - written
        written |= access.writes
    return frozenset(needed)


class PruneCacheUnit(PipelineUnit):
    """Drops every state key not in ``keep``; meant as the last unit of stage 1 only.

    It deletes keys, which the split does not model, so it must not sit among the units being split.

    Args:
        keep: Names (kept in every scope) or ``(scope, name)`` pairs.
    """

    def __init__(self, keep: Iterable[str | StateKey]) -> None:
        super().__init__(take_over=True)
        self.keep = expand_keys(keep, "keep")

    def process(self, pipe: Any, inputs_shared: dict, inputs_posi: dict,
                inputs_nega: dict) -> tuple[dict, dict, dict]:
        pruned = [{name: value for name, value in state.items() if (scope, name) in self.keep}
                  for scope, state in zip(SCOPES, (inputs_shared, inputs_posi, inputs_nega))]
        return pruned[0], pruned[1], pruned[2]

    def __repr__(self) -> str:
        return f"PruneCacheUnit(keep={sorted(self.keep)})"


def stage_one_units(units: Sequence[PipelineUnit], model_names: Iterable[str],
                    extra_keys: Iterable[str | StateKey] = (), prune_cache: bool = True) -> list[PipelineUnit]:
    """The units of the data-processing stage: the unrelated ones, then cache pruning.

    Pruning trades nothing at training time for a smaller cache on disk (often the raw images and prompts are most of
    it); turn it off only to inspect a full cache.

    Args:
        units: The pipeline's units, in run order.
        model_names: The models that receive gradients.
        extra_keys: Keys the loss reads after the last unit; they are both kept exact and kept in the cache. Stage 2
            must split with ``final_keys=extra_keys``.
        prune_cache: Append the ``PruneCacheUnit``.

    Returns:
        The stage-1 units in run order.
    """
    extra_keys = tuple(expand_keys(extra_keys, "extra_keys"))
    related, unrelated = split_pipeline_units(units, model_names, final_keys=extra_keys)
    if not prune_cache:
        return unrelated
    return [*unrelated, PruneCacheUnit(required_cache_keys(related, final_keys=extra_keys))]
