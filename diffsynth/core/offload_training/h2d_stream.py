"""H2D-only weight streaming for frozen-base (LoRA) training: a ring of device slots, one copy per block load.

A policy on the residency driver (``hooks.py``); configuration and public API in ``block_swap.py``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import torch
from torch import nn

from ..shared_weights import shared_span
from .block_swap import (
    NO_CHECKPOINTING_MESSAGE,
    BlockSequence,
    BlockSwap,
    BlockSwapConfig,
    is_adapter_parameter,
    streaming_block_indices,
)
from .memory_buffer import align, tensor_nbytes
from .transfer import TensorSlot, byte_views, tensor_slots

logger = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class _StreamedBlock:
    """One streamed block: its tensors, their byte offsets, the flat host master and views into it."""

    index: int
    slots: list[TensorSlot]
    offsets: list[int]
    nbytes: int
    master: torch.Tensor
    master_views: list[torch.Tensor]
    slot_views: list[list[torch.Tensor]] = dataclasses.field(default_factory=list)


class H2DOnlyBlockSwap(BlockSwap):
    """H2D-only streaming for a frozen base: S evenly spaced blocks share a ring of B device slots.

    Slot protocol (rank k = position among the streamed blocks, slot = k mod B):

    - forward start (the model's forward pre-hook; block 0's for a bare list): ranks 0..B-1 are loaded into their
      slots (a no-op when the previous backward or the inference wrap-around left them there);
    - before rank k computes, forward or recompute: it must be in its slot; if its prefetch was never issued (cold
      start, blocks called out of order) it is loaded now (a self-heal), then compute waits for its copy;
    - after rank k's forward: rank k + B is loaded into the same slot, evicting k (the engine starts the copy only
      after the compute queued so far, so k's kernels are done with the slot first);
    - after rank k's backward (its input gradients are done): rank k - B is loaded into its slot; the last B ranks
      of a forward are the first B of the backward and are not reloaded;
    - inference (no streamed block needed a backward in this pass): after the last rank, ranks 0..B-1 are loaded
      again, so the next forward finds them (the forward-only wrap-around).

    Eviction re-points the weights at their host master: nothing is copied back. Trainable tensors and buffers of
    streamed blocks stay on the device outside the masters.

    Raises:
        ValueError: A streamed weight is trainable.
        RuntimeError: A streamed block runs a training forward without gradient checkpointing.
    """

    mode_name = "H2D-only"

    def __init__(self, blocks: BlockSequence | nn.ModuleList, config: BlockSwapConfig, device: torch.device,
                 model: nn.Module | None = None, list_name: str = "blocks",
                 keep_resident: Callable[[str], bool] | None = None) -> None:
        super().__init__(blocks, config, device, model, list_name)
        keep_resident = keep_resident or is_adapter_parameter
        self.stream_indices = streaming_block_indices(self.num_blocks, config.blocks_to_swap)
        self.rank = {index: k for k, index in enumerate(self.stream_indices)}
        self.ring_size = min(config.ring_size, len(self.stream_indices))
        plans = {}
        for index in self.stream_indices:
            block, name = self.blocks[index], self.blocks.names[index]
            slots = [s for s in tensor_slots(block, name) if s.is_param and not keep_resident(s.name)]
            for slot in slots:
                if slot.get().requires_grad:
                    raise ValueError(
                        f"H2D-only block swap streams the frozen weights of {name} "
                        f"({type(block).__name__}), but {slot.name} requires grad: weights are only copied "
                        "host-to-device, so its updates would be lost. Freeze the base model and train a LoRA (LoRA "
                        "parameters, named lora_*, are small and stay resident on the device, outside the streamed "
                        "weights), or drop --block_swap_h2d_only for classic block swap")
            offsets, end = [], 0
            for slot in slots:
                offsets.append(align(end))
                end = offsets[-1] + tensor_nbytes(slot.get())
            plans[index] = (slots, offsets, end)
        # A block the loader put in the machine's shared copy is already packed there: its span is the master.
        spans = {index: shared_span([slot.get().data for slot in slots], offsets, nbytes)
                 for index, (slots, offsets, nbytes) in plans.items()}
        pool = self._host_pool([plan[2] for index, plan in plans.items() if spans[index] is None])
        self.streamed: dict[int, _StreamedBlock] = {}
        for index, (slots, offsets, nbytes) in plans.items():
            tensors = [slot.get().data for slot in slots]
            master = spans[index]
            if master is None:
                master = pool.allocate(nbytes) if nbytes else torch.empty(0, dtype=torch.uint8)
            views = byte_views(master, tensors, offsets)
            for slot, tensor, view in zip(slots, tensors, views):
                if spans[index] is None:
                    view.copy_(tensor)
                self._keep_on_host(slot, view)
            self.streamed[index] = _StreamedBlock(index, slots, offsets, nbytes, master, views)
        # Blocks may differ in size (FLUX's double blocks are larger than its single ones): a slot holds the largest
        # streamed block, and a smaller one fills its head (a load copies ``nbytes``, its views start at 0).
        slot_bytes = max(block.nbytes for block in self.streamed.values())
        self._offloaded_bytes = sum(block.nbytes for block in self.streamed.values())
        # The ring is allocated once; every load copies into it, and each block's views into it are made here.
        self.ring = [torch.empty(slot_bytes, dtype=torch.uint8, device=device) for _ in range(self.ring_size)]
        for block in self.streamed.values():
            block.slot_views = [byte_views(flat, block.master_views, block.offsets) for flat in self.ring]
        self.meter.add(slot_bytes * self.ring_size)
        self.in_slot: list[int | None] = [None] * self.ring_size
        self._pass_needs_backward = False
        self._start(slot_bytes)
        # Over several lists an index alone does not say which block it is, so the log names them.
        several = len(self.blocks.list_names) > 1
        shown = [self.blocks.names[i] for i in self.stream_indices] if several else self.stream_indices
        logger.info("H2D-only block swap on %s.%s: streaming blocks %s of %d through %d device slot(s) of %.1f MiB "
                    "(engine %s)", type(model).__name__ if model is not None else "", self.list_name, shown,
                    self.num_blocks, self.ring_size, slot_bytes / 2**20, self.engine_name)

    def _bind(self, rank: int, views: list[torch.Tensor]) -> None:
        for slot, view in zip(self.streamed[self.stream_indices[rank]].slots, views):
            slot.bind(view)

    def _load(self, rank: int) -> None:
        slot = rank % self.ring_size
        if self.in_slot[slot] == rank:
            return
        previous = self.in_slot[slot]
        if previous is not None:
            self._bind(previous, self.streamed[self.stream_indices[previous]].master_views)
            self._record("evict", self.stream_indices[previous], slot)
        block = self.streamed[self.stream_indices[rank]]
        self.engine.submit(block.index, [(self.ring[slot][:block.nbytes], block.master)])
        self._bind(rank, block.slot_views[slot])
        self.in_slot[slot] = rank
        self._record("load", block.index, slot)

    def _ensure(self, index: int) -> None:
        rank = self.rank[index]
        if self.in_slot[rank % self.ring_size] != rank:
            self._self_heal(index)
            self._load(rank)
        self.engine.wait(index)

    def on_pass_start(self) -> None:
        self._pass_needs_backward = False
        for rank in range(self.ring_size):
            self._load(rank)

    def before_forward(self, index: int, needs_backward: bool, checkpointed: bool) -> None:
        if index not in self.rank:
            return
        if needs_backward and not checkpointed:
            name = f"{self.blocks.names[index]} ({type(self.blocks[index]).__name__})"
            raise RuntimeError(f"{name} is streamed by H2D-only block swap and ran a training forward without "
                               f"gradient checkpointing. {NO_CHECKPOINTING_MESSAGE}")
        self._pass_needs_backward |= needs_backward
        self._ensure(index)

    def after_forward(self, index: int, needs_backward: bool, bounded: bool) -> None:
        rank = self.rank.get(index)
        if rank is None:
            return
        count = len(self.stream_indices)
        if rank + self.ring_size < count:
            self._load(rank + self.ring_size)
        elif rank == count - 1 and count > self.ring_size and not self._pass_needs_backward:
            for first in range(self.ring_size):
                self._load(first)

    def before_recompute(self, index: int) -> None:
        if index in self.rank:
            self._ensure(index)

    def on_backward_done(self, index: int) -> None:
        rank = self.rank.get(index)
        if rank is not None and rank - self.ring_size >= 0:
            self._load(rank - self.ring_size)


