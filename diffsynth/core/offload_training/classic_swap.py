"""Classic (exchange) block swap: the last ``blocks_to_swap`` blocks live in host memory between uses.

A policy on the residency driver (``hooks.py``); configuration and public API in ``block_swap.py``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..device import warn_once
from ..shared_weights import is_shared_host
from .block_swap import BlockSequence, BlockSwap, BlockSwapConfig
from .memory_buffer import tensor_nbytes
from .transfer import DirectEngine, tensor_slots


class ClassicBlockSwap(BlockSwap):
    """Exchange block swap: the last ``blocks_to_swap`` blocks of the sequence live in host memory between uses.

    Forward: block i's pre-hook makes sure it is on the device and prefetches swapped block i + 1; its post-hook
    copies it back out. Backward: the gradient reaching a swapped block's outputs loads it (for the recompute) and
    prefetches block i - 1; once its input gradients are done it is copied out. Trainable parameters of swapped
    blocks stay on the device. Without gradient checkpointing autograd keeps a training forward's weights for
    backward anyway, so such a block stays loaded until its backward is done: correct, but it saves little.
    """

    mode_name = "classic"

    wants_backward_start = True

    def __init__(self, blocks: BlockSequence | nn.ModuleList, config: BlockSwapConfig, device: torch.device,
                 model: nn.Module | None = None, list_name: str = "blocks") -> None:
        super().__init__(blocks, config, device, model, list_name)
        self.first_swapped = self.num_blocks - config.blocks_to_swap
        slots = {i: [s for s in tensor_slots(self.blocks[i], self.blocks.names[i])
                     if not (s.is_param and s.get().requires_grad)] for i in self.swapped}
        pool = self._host_pool([tensor_nbytes(s.get()) for block in slots.values() for s in block
                                if not is_shared_host(s.get())])
        self._moved = {i: [] for i in slots}
        # Masters in the machine's shared copy are frozen weights: used in place, never written back.
        self._read_only: set[int] = set()
        for i, block in slots.items():
            for slot in block:  # each copy replaces its tensor at once, so host memory holds one extra at most
                tensor = slot.get().detach()
                host = tensor if is_shared_host(tensor) else pool.allocate_like(tensor.contiguous())
                if host is tensor:
                    self._read_only.add(id(host))
                self._moved[i].append((slot, host))
                self._keep_on_host(*self._moved[i][-1])
        self._nbytes = {i: sum(tensor_nbytes(host) for _, host in moved) for i, moved in self._moved.items()}
        self._offloaded_bytes = sum(self._nbytes.values())
        self._loaded: set[int] = set()
        self._kept: set[int] = set()
        self._start(max((tensor_nbytes(host) for moved in self._moved.values() for _, host in moved), default=1))
        # A D2H copy into pinned memory may run asynchronously only when the next reader is the copy stream (direct).
        self._async_copy_out = isinstance(self.engine, DirectEngine) and config.use_pinned_memory

    @property
    def swapped(self) -> range:
        """Indices of the blocks that live in host memory."""
        return range(self.num_blocks - self.config.blocks_to_swap, self.num_blocks)

    def _load(self, index: int) -> None:
        if index not in self.swapped or index in self._loaded:
            return
        copies = [(torch.empty_like(host, device=self.device), host) for _, host in self._moved[index]]
        for (slot, _), (device_copy, _) in zip(self._moved[index], copies):
            slot.bind(device_copy)
        self.engine.submit(index, copies)
        self._loaded.add(index)
        self.meter.add(self._nbytes[index])
        self._record("load", index, None)

    def _ensure(self, index: int) -> None:
        if index in self.swapped:
            if index not in self._loaded:
                self._self_heal(index)
                self._load(index)
            self.engine.wait(index)

    def _unload(self, index: int) -> None:
        if index not in self._loaded:
            return
        # The device copies are freed below, so no outstanding copy may still be writing them.
        self.engine.wait(index)
        for slot, host in self._moved[index]:
            if id(host) not in self._read_only:
                host.copy_(slot.get(), non_blocking=self._async_copy_out)
            slot.bind(host)
        self._loaded.discard(index)
        self._kept.discard(index)
        self.meter.sub(self._nbytes[index])
        self._record("evict", index, None)

    def on_pass_start(self) -> None:
        # Blocks left loaded by a backward that never reached them (no input needed a gradient) go out now, unless
        # some graph still awaits its backward.
        if not any(self.driver.pending):
            for index in sorted(self._loaded):
                self._unload(index)
        self._load(self.first_swapped)

    def before_forward(self, index: int, needs_backward: bool, checkpointed: bool) -> None:
        self._ensure(index)
        self._load(index + 1)
        if index in self.swapped and needs_backward and not checkpointed:
            warn_once("block-swap-no-checkpointing", "classic block swap without gradient checkpointing keeps each "
                      "swapped block on the device until its backward (autograd holds its weights); add "
                      "--use_gradient_checkpointing to save device memory")
            self._kept.add(index)

    def after_forward(self, index: int, needs_backward: bool, bounded: bool) -> None:
        if index not in self._kept:
            self._unload(index)

    def on_backward_start(self, index: int) -> None:
        self._load(index)
        self._load(index - 1)

    def before_recompute(self, index: int) -> None:
        self.on_backward_start(index)
        self._ensure(index)

    def on_backward_done(self, index: int) -> None:
        self._unload(index)

    def _evict_all(self) -> None:
        for index in sorted(self._loaded):
            self._unload(index)
