"""Dry runs of a few blocks standing for all of them: what a step of a deep model saves, computes and moves, found
from shallow copies of it.

A diffusion transformer repeats one block tens of times (Qwen-Image 60, Wan2.1-14B 40), and a dry run on the meta
device costs Python time per operation: minutes for every block of a 20B model. Where every block of a list holds the
same tensors (names, shapes, dtypes, which are trained), what a dry run measures is affine in the depth of each list:
the blocks at the ends differ from the others (the first one's inputs need no gradient, a tensor every block reads is
saved by the first that saves it, the last one feeds the output layers), and each block in between adds the same
bytes and operations. So the planner runs the model with each list cut to ``BASE_DEPTH`` blocks, then once more per
list with that list one block deeper, and extrapolates each count to the real depths; per-block figures are the
deeper run's, its last block but one repeated in between. Sizes that depend on every tensor at once (the host
arena's power-of-two chunks) are never extrapolated: they are computed from the whole model, which is only built,
never run.

Lists whose blocks differ (a LoRA on some blocks only) are run in full, as is a model whose lists are too short to
gain anything. ``tests/core/planning`` checks extrapolated figures against full dry runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from torch import nn

from ..offload_training.block_swap import BlockSequence

BASE_DEPTH = 3
"""Blocks per list in the shallowest run. Three, not two: the second block can differ from the later ones too (a
tensor that the blocks share, such as the timestep embedding, is saved once, by the first block that saves it for
backward, and the first block's inputs need no gradient)."""

Measured = TypeVar("Measured")


def _signature(block: nn.Module) -> tuple:
    return tuple((name, tuple(t.shape), t.dtype, t.requires_grad)
                 for name, t in [*block.named_parameters(), *block.named_buffers()])


def shallow_depths(model: nn.Module, blocks: Sequence[nn.Module]) -> dict[str, int] | None:
    """The depth of each block list of ``model`` when shallow runs can stand for it; None when it must run in full.

    They can when ``blocks`` is a ``BlockSequence`` of ``model``'s own lists, each deeper than ``BASE_DEPTH + 1``, and
    every block of a list holds the same tensors (names, shapes, dtypes, whether trained).
    """
    if not isinstance(blocks, BlockSequence):
        return None
    depths = {}
    for name in blocks.list_names:
        found = getattr(model, name, None)
        if not isinstance(found, nn.ModuleList) or len(found) <= BASE_DEPTH + 1:
            return None
        first = _signature(found[0])
        if any(_signature(block) != first for block in found[1:]):
            return None
        depths[name] = len(found)
    return depths


@contextlib.contextmanager
def cut_to(model: nn.Module, depths: dict[str, int]) -> Iterator[BlockSequence]:
    """While active, each block list of ``model`` named in ``depths`` holds only its first blocks; yields them."""
    lists = {name: getattr(model, name) for name in depths}
    try:
        for name, depth in depths.items():
            setattr(model, name, nn.ModuleList(list(lists[name])[:depth]))
        yield BlockSequence.of_lists(*((name, getattr(model, name)) for name in depths))
    finally:
        for name, blocks in lists.items():
            setattr(model, name, blocks)


def extrapolated(measure: Callable[[BlockSequence], Measured], model: nn.Module,
                 depths: dict[str, int]) -> Measured:
    """What ``measure`` would find on ``model`` at ``depths``, from runs of ``BASE_DEPTH`` and one block more per list.

    Args:
        measure: A dry run of the model as it is when called, given its blocks; returns a dataclass of ints and of
            per-block lists of ints (one entry per block of the sequence).
        model: The model whose block lists are cut.
        depths: The real depth of each list (``shallow_depths``).
    """
    names = list(depths)
    with cut_to(model, {name: BASE_DEPTH for name in names}) as blocks:
        base = measure(blocks)
    deeper = []
    for name in names:
        with cut_to(model, {other: BASE_DEPTH + (other == name) for other in names}) as blocks:
            deeper.append(measure(blocks))
    values = {}
    for field in dataclasses.fields(base):
        start = getattr(base, field.name)
        if isinstance(start, list):
            values[field.name] = _per_block([getattr(run, field.name) for run in deeper], depths)
        else:
            values[field.name] = start + sum((depths[name] - BASE_DEPTH) * (getattr(run, field.name) - start)
                                             for name, run in zip(names, deeper))
    return dataclasses.replace(base, **values)


def _per_block(runs: list[list[int]], depths: dict[str, int]) -> list[int]:
    # In the run where list i is one block deeper, its blocks sit after BASE_DEPTH blocks of each list before it.
    full = []
    for index, (run, depth) in enumerate(zip(runs, depths.values())):
        start = index * BASE_DEPTH
        blocks = run[start:start + BASE_DEPTH + 1]
        full += [*blocks[:-2], *[blocks[-2]] * (depth - BASE_DEPTH), blocks[-1]]
    return full
