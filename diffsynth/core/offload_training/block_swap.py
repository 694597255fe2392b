"""Block swap: run or train a transformer whose block list does not fit on the device, a few blocks at a time.

- ``ClassicBlockSwap`` (exchange): the last ``blocks_to_swap`` blocks live in host memory; each is copied to the
  device just before it runs and back out after it. Any block, any training; a copy each way per block and pass.
- ``H2DOnlyBlockSwap`` (``h2d_only``), for a frozen base: evenly spaced blocks stream their frozen weights, packed
  into one flat (pinned) host master per block, through a ring of device slots allocated once; nothing is copied
  back. Needs gradient checkpointing to train.

Both work through hooks on the blocks, so model forward loops need no change, and compose with diffusers' gradient
checkpointing (a block re-run inside backward is recognised by autograd's current graph task). Copies go through a
transfer engine (``transfer.py``); ``remove()`` restores the model.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

import torch
from torch import nn

from ..device import allocate_host_bytes, resolve_device, synchronize, warn_once
from .autograd_hooks import inside_backward, iter_tensors, wrap_inputs
from .memory_buffer import PinnedArenaPool, tensor_nbytes
from .offloader import ResidencyMeter
from .transfer import DEFAULT_STAGING_BYTES, ENGINES, DirectEngine, TensorSlot, TransferTimer, make_engine, tensor_slots

logger = logging.getLogger(__name__)

BLOCK_LIST_NAMES = ("transformer_blocks", "blocks")
"""Attributes searched for the block list: Qwen-Image's ``transformer_blocks``, Wan's ``blocks``."""


@dataclasses.dataclass
class BlockSwapConfig:
    """How block swap runs, checked at construction; errors name the flag, the value and the fix.

    Args:
        blocks_to_swap: Blocks kept off the device (``--blocks_to_swap``); 0 turns block swap off.
        h2d_only: Stream frozen weights through a device ring instead of exchanging blocks (``--block_swap_h2d_only``).
        ring_size: Device slots of the H2D-only ring (``--block_swap_ring_size``): 2 overlaps one block's copy with
            another's compute; 1 uses the least memory; more absorbs uneven block times. Clamped to the streamed
            count.
        use_pinned_memory: Host copies in page-locked memory (``--use_pinned_memory_for_block_swap``): about twice as
            fast and fully asynchronous copies, for host memory the OS can never page out.
        gradient_checkpointing: Whether the blocks run under gradient checkpointing; None if unknown (checked when a
            streamed block runs a training forward). False with ``h2d_only`` is refused.
        engine: Transfer engine: ``auto``, ``direct``, ``staged`` or ``sync`` (see ``transfer.py``).
        num_staging_buffers: Staging buffers of the ``staged`` engine.
        debug_timing: Record per-block copy and stall times for ``report()`` (adds events; for diagnosis only).
        record_trace: Record load/evict/compute events in ``offloader.trace`` (for tests; grows every pass).
    """

    blocks_to_swap: int = 0
    h2d_only: bool = False
    ring_size: int = 2
    use_pinned_memory: bool = False
    gradient_checkpointing: bool | None = None
    engine: str = "auto"
    num_staging_buffers: int = 2
    debug_timing: bool = False
    record_trace: bool = False

    def __post_init__(self) -> None:
        _check_count("blocks_to_swap", self.blocks_to_swap, "--blocks_to_swap", 0,
                     "0 (off) or the number of blocks to keep off the device")
        _check_count("ring_size", self.ring_size, "--block_swap_ring_size", 1,
                     "at least 1 device slot (2, the default, overlaps copies with compute)")
        _check_count("num_staging_buffers", self.num_staging_buffers, None, 1, "at least 1")
        if self.engine not in ENGINES:
            raise ValueError(f"engine={self.engine!r} is not a block swap transfer engine; choose one of "
                             f"{', '.join(ENGINES)}")
        if self.h2d_only and self.blocks_to_swap and self.gradient_checkpointing is False:
            raise ValueError(NO_CHECKPOINTING_MESSAGE)

    @property
    def enabled(self) -> bool:
        return self.blocks_to_swap > 0

    @classmethod
    def from_args(cls, args: Any, training: bool = True) -> BlockSwapConfig:
        """Builds the config from parsed CLI flags; flags a parser lacks take their defaults.

        Args:
            args: The ``argparse`` namespace.
            training: Whether ``args`` configure a training run; then ``--use_gradient_checkpointing`` (or its
                offload variant) is read, and H2D-only without it is refused here rather than mid-step.
        """
        checkpointing = None
        if training:
            checkpointing = bool(getattr(args, "use_gradient_checkpointing", False)
                                 or getattr(args, "use_gradient_checkpointing_offload", False))
        return cls(blocks_to_swap=getattr(args, "blocks_to_swap", 0) or 0,
                   h2d_only=bool(getattr(args, "block_swap_h2d_only", False)),
                   ring_size=getattr(args, "block_swap_ring_size", 2),
                   use_pinned_memory=bool(getattr(args, "use_pinned_memory_for_block_swap", False)),
                   gradient_checkpointing=checkpointing)


NO_CHECKPOINTING_MESSAGE = (
    "--block_swap_h2d_only needs --use_gradient_checkpointing to train: it reuses a few device slots for the streamed "
    "weights, and without checkpointing autograd would keep references to slot memory that is overwritten before "
    "backward. Add --use_gradient_checkpointing (model.enable_gradient_checkpointing()), or drop "
    "--block_swap_h2d_only for classic block swap")


def _check_count(name: str, value: Any, flag: str | None, minimum: int, meaning: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        where = f" ({flag})" if flag else ""
        raise ValueError(f"{name}={value!r}{where} must be {meaning}")


def find_block_list(model_or_blocks: nn.Module) -> tuple[nn.ModuleList, str]:
    """The block list of a diffusers transformer (``transformer_blocks``, ``blocks``), or the given ``ModuleList``.

    Raises:
        ValueError: No non-empty ``ModuleList`` under those names; the message names the model class.
    """
    if isinstance(model_or_blocks, nn.ModuleList):
        return model_or_blocks, "blocks"
    for name in BLOCK_LIST_NAMES:
        blocks = getattr(model_or_blocks, name, None)
        if isinstance(blocks, nn.ModuleList) and len(blocks) > 0:
            return blocks, name
    raise ValueError(f"block swap found no block list on {type(model_or_blocks).__name__}: it looks for a non-empty "
                     f"nn.ModuleList named {' or '.join(BLOCK_LIST_NAMES)}; pass the block list itself "
                     "(create_offloader(model.<blocks>, ...)) or turn block swap off (--blocks_to_swap 0)")


def streaming_block_indices(num_blocks: int, count: int) -> list[int]:
    """``count`` block indices spread evenly over ``num_blocks`` (the midpoint of each of ``count`` equal spans).

    Evenly spaced streamed blocks leave resident blocks between them whose compute hides the next block's copy.
    """
    return [((2 * k + 1) * num_blocks) // (2 * count) for k in range(count)]


def is_adapter_parameter(name: str) -> bool:
    """Whether a parameter belongs to a peft adapter (a ``lora_*`` module or vector), which is never streamed."""
    return any(part.startswith("lora_") for part in name.split("."))


def _saved_tensors_are_hooked() -> bool:
    # Non-reentrant checkpointing (and activation offloading) installs saved-tensor hooks around the block, so autograd
    # keeps no reference to the block's weights; their absence in a training forward means weights are saved as is.
    return torch._C._autograd._top_saved_tensors_default_hooks(False) is not None


class _PendingBackward:
    """A block call whose backward is pending, called when its input gradients are done (``UnitBoundary``).

    A graph dropped without a backward frees it with the boundary node; ``__del__`` then releases the count, so a
    discarded forward never pins a block.
    """

    def __init__(self, swap: BlockSwap, index: int) -> None:
        self.swap, self.index, self.open = swap, index, True
        swap._pending[index] += 1

    def _close(self) -> None:
        if self.open:
            self.open = False
            self.swap._pending[self.index] -= 1

    def __call__(self) -> None:
        self._close()
        self.swap._on_backward_done(self.index)

    def __del__(self) -> None:
        self._close()


class BlockSwap:
    """Hooks and bookkeeping shared by both modes; subclasses decide what moves and when.

    Args:
        blocks: The block list, in execution order.
        config: The checked configuration.
        device: The compute device.
        model: The model owning the list; its other tensors are placed on the device too. None: only the blocks are.
        list_name: The list's attribute name, for messages.
    """

    mode_name = "block swap"

    def __init__(self, blocks: nn.ModuleList, config: BlockSwapConfig, device: torch.device,
                 model: nn.Module | None = None, list_name: str = "blocks") -> None:
        if not config.enabled:
            raise ValueError("blocks_to_swap=0 turns block swap off: use create_offloader, which returns None then")
        if config.blocks_to_swap > len(blocks):
            owner = type(model).__name__ + "." if model is not None else ""
            raise ValueError(f"blocks_to_swap={config.blocks_to_swap} (--blocks_to_swap) but {owner}{list_name} has "
                             f"only {len(blocks)} blocks; use at most {len(blocks)}")
        self.blocks, self.config, self.device, self.model = blocks, config, device, model
        self.list_name = list_name
        self.num_blocks = len(blocks)
        self.trace: list[tuple] | None = [] if config.record_trace else None
        self.timer = TransferTimer() if config.debug_timing else None
        self.meter = ResidencyMeter()
        self.self_heals = 0
        self._pending = [0] * self.num_blocks
        self._needs_backward = [False] * self.num_blocks
        self._trainable = [any(p.requires_grad for p in block.parameters()) for block in blocks]
        self._placed: list[tuple[TensorSlot, torch.device]] = []
        self._handles: list[Any] = []
        self.engine = None

    def _start(self, managed: set[int], pinned_masters: bool, staging_bytes: int) -> None:
        """Places every unmanaged tensor on the device, builds the engine and registers the hooks."""
        for slot in tensor_slots(self.model if self.model is not None else self.blocks, ""):
            tensor = slot.get()
            if id(tensor) not in managed and tensor.device != self.device:
                self._placed.append((slot, tensor.device))
                slot.bind(tensor.data.to(self.device))
                if slot.is_param and slot.get().grad is not None:
                    slot.get().grad = slot.get().grad.to(self.device)
        # Staging buffers as large as one block's copy, up to a cap (larger copies go through in chunks): they are
        # pinned, and keeping few small pinned buffers is the point of the staged engine.
        self.engine = make_engine(self.config.engine, self.device, pinned_masters, self.config.num_staging_buffers,
                                  min(max(1, staging_bytes), DEFAULT_STAGING_BYTES), self.timer)
        self.engine_name = self.engine.name
        if self.model is not None:
            # The model's own pre-hook starts the first loads before the embeddings run, so they overlap them.
            self._handles.append(self.model.register_forward_pre_hook(lambda module, args: self._forward_start()))
        for index, block in enumerate(self.blocks):
            self._handles.append(block.register_forward_pre_hook(functools.partial(self._pre_hook, index),
                                                                 with_kwargs=True))
            self._handles.append(block.register_forward_hook(functools.partial(self._post_hook, index)))

    # ---- hooks --------------------------------------------------------------------------------------------------

    def _pre_hook(self, index: int, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if inside_backward():
            # A re-run inside backward: gradient checkpointing recomputing the block.
            self._on_recompute(index)
            self._record("recompute", index)
            if self._pending[index] == 0 and torch.is_grad_enabled():
                # Reentrant checkpointing ran the forward without grad; this re-run's graph is the one backpropagated.
                return self._wrap_inputs(index, args, kwargs)
            return None
        if index == 0 and self.model is None:
            self._forward_start()
        needs_backward = torch.is_grad_enabled() and (self._trainable[index] or any(
            t.requires_grad for t in iter_tensors((args, kwargs))))
        self._needs_backward[index] = needs_backward
        self._before_forward(index, needs_backward, needs_backward and _saved_tensors_are_hooked())
        self._record("compute", index)
        return self._wrap_inputs(index, args, kwargs) if needs_backward else None

    def _wrap_inputs(self, index: int, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        pending = _PendingBackward(self, index)
        wrapped = wrap_inputs(pending, args, kwargs)
        if wrapped is None:
            pending._close()  # no input needs a gradient: no backward will come for this call
        return wrapped

    def _post_hook(self, index: int, module: nn.Module, args: tuple, output: Any) -> None:
        if inside_backward():
            return
        if self._needs_backward[index] and self._wants_backward_start:
            for tensor in iter_tensors(output):
                if tensor.requires_grad and tensor.grad_fn is not None:
                    tensor.register_hook(lambda grad, i=index: self._on_backward_start(i))
        self._after_forward(index, self._needs_backward[index])

    def _forward_start(self) -> None:
        if not inside_backward():
            self._record("forward")
            self._on_forward_start()

    def _record(self, *event: Any) -> None:
        if self.trace is not None:
            self.trace.append(event)

    # ---- what subclasses decide (no-ops here) -------------------------------------------------------------------

    _wants_backward_start = False  # whether outputs get a hook calling _on_backward_start when their gradient arrives

    def _on_forward_start(self) -> None:
        """The model's forward begins (block 0's, for a bare block list)."""

    def _before_forward(self, index: int, needs_backward: bool, checkpointed: bool) -> None:
        """Block ``index`` is about to run a forward (not a recompute)."""

    def _after_forward(self, index: int, needs_backward: bool) -> None:
        """Block ``index`` has queued its forward."""

    def _on_recompute(self, index: int) -> None:
        """Block ``index`` is re-run inside backward (gradient checkpointing)."""

    def _on_backward_start(self, index: int) -> None:
        """A gradient of block ``index``'s outputs has arrived."""

    def _on_backward_done(self, index: int) -> None:
        """The gradients of block ``index``'s inputs are complete."""

    def _restore(self) -> None:
        raise NotImplementedError

    # ---- public API ---------------------------------------------------------------------------------------------

    @property
    def offloaded_bytes(self) -> int:
        """Bytes of block weights kept in host memory (what the device saves, before the swap/ring memory)."""
        return self._offloaded_bytes

    @property
    def peak_swapped_bytes(self) -> int:
        """The most bytes of swapped or streamed weights on the device at once (H2D-only: the ring, allocated once)."""
        return self.meter.peak

    def report(self) -> str:
        """Per-block copy and stall times since construction (needs ``debug_timing``; synchronises the device)."""
        if self.timer is None:
            return "block swap timing is off; build the config with debug_timing=True"
        if self.engine is not None:
            self.engine.synchronize()
            synchronize(self.device)
        self.timer.resolve()
        return self.timer.format(f"block swap ({self.mode_name}, engine {self.engine_name}, {self.config.blocks_to_swap} of "
                                 f"{self.num_blocks} blocks): per-block copy and stall time")

    def remove(self) -> None:
        """Detaches the hooks and turns every moved tensor back into an ordinary tensor on its original device."""
        if self.engine is None:
            return
        # Both the copy stream and the compute stream (classic copies out on it) must be idle before host reads.
        self.engine.synchronize()
        synchronize(self.device)
        if self.timer is not None:
            self.timer.resolve()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._restore()
        for slot, device in self._placed:
            slot.bind(slot.get().data.to(device))
            if slot.is_param and slot.get().grad is not None:
                slot.get().grad = slot.get().grad.to(device)
        self._placed.clear()
        self.engine.close()
        self.engine = None


@dataclasses.dataclass(eq=False)
class _Moved:
    slot: TensorSlot
    host: torch.Tensor
    original_device: torch.device


class ClassicBlockSwap(BlockSwap):
    """Exchange block swap: the last ``blocks_to_swap`` blocks live in host memory between uses.

    Forward: block i's pre-hook makes sure it is on the device and prefetches swapped block i + 1; its post-hook
    copies it back out. Backward: the gradient reaching a swapped block's outputs loads it (for the recompute) and
    prefetches block i - 1; once its input gradients are done it is copied out. Trainable parameters of swapped
    blocks stay on the device. Without gradient checkpointing autograd keeps a training forward's weights for
    backward anyway, so such a block stays loaded until its backward is done: correct, but it saves little.
    """

    mode_name = "classic"

    _wants_backward_start = True

    def __init__(self, blocks: nn.ModuleList, config: BlockSwapConfig, device: torch.device,
                 model: nn.Module | None = None, list_name: str = "blocks") -> None:
        super().__init__(blocks, config, device, model, list_name)
        self.first_swapped = self.num_blocks - config.blocks_to_swap
        self._moved: dict[int, list[_Moved]] = {}
        slots = {i: [s for s in tensor_slots(blocks[i], f"{list_name}.{i}")
                     if not (s.is_param and s.get().requires_grad)] for i in self.swapped}
        pool = PinnedArenaPool([tensor_nbytes(s.get()) for i in slots for s in slots[i]],
                               allocator=functools.partial(allocate_host_bytes, pinned=config.use_pinned_memory))
        managed = set()
        for i, block_slots in slots.items():
            self._moved[i] = []
            for slot in block_slots:
                tensor = slot.get()
                moved = _Moved(slot, pool.allocate_like(tensor.detach().contiguous()), tensor.device)
                self._moved[i].append(moved)
                slot.bind(moved.host)
                managed.add(id(slot.get()))
        self._nbytes = {i: sum(tensor_nbytes(m.host) for m in moved) for i, moved in self._moved.items()}
        self._offloaded_bytes = sum(self._nbytes.values())
        self._loaded: set[int] = set()
        self._kept: set[int] = set()
        largest = max((tensor_nbytes(m.host) for moved in self._moved.values() for m in moved), default=1)
        self._start(managed, config.use_pinned_memory, largest)
        # A D2H copy into pinned memory may run asynchronously only when the next reader is the copy stream (direct).
        self._async_copy_out = isinstance(self.engine, DirectEngine) and config.use_pinned_memory

    @property
    def swapped(self) -> range:
        """Indices of the blocks that live in host memory."""
        return range(self.num_blocks - self.config.blocks_to_swap, self.num_blocks)

    def _load(self, index: int) -> None:
        if index not in self.swapped or index in self._loaded:
            return
        copies = []
        for moved in self._moved[index]:
            device_copy = torch.empty_like(moved.host, device=self.device)
            copies.append((device_copy, moved.host))
            moved.slot.bind(device_copy)
        self.engine.submit(index, copies)
        self._loaded.add(index)
        self.meter.add(self._nbytes[index])
        self._record("load", index, None)

    def _ensure(self, index: int) -> None:
        if index in self.swapped:
            if index not in self._loaded:
                self.self_heals += 1
                if self.timer is not None:
                    self.timer.of(index).self_heals += 1
                self._load(index)
            self.engine.wait(index)

    def _unload(self, index: int) -> None:
        if index not in self._loaded:
            return
        # The device copies are freed below, so no outstanding copy may still be writing them.
        self.engine.wait(index)
        for moved in self._moved[index]:
            moved.host.copy_(moved.slot.get(), non_blocking=self._async_copy_out)
            moved.slot.bind(moved.host)
        self._loaded.discard(index)
        self._kept.discard(index)
        self.meter.sub(self._nbytes[index])
        self._record("evict", index, None)

    def _on_forward_start(self) -> None:
        # Blocks left loaded by a backward that never reached them (no input needed a gradient) go out now, unless
        # some graph still awaits its backward.
        if not any(self._pending):
            for index in sorted(self._loaded):
                self._unload(index)
        self._load(self.first_swapped)

    def _before_forward(self, index: int, needs_backward: bool, checkpointed: bool) -> None:
        self._ensure(index)
        self._load(index + 1)
        if index in self.swapped and needs_backward and not checkpointed:
            warn_once("block-swap-no-checkpointing", "classic block swap without gradient checkpointing keeps each "
                      "swapped block on the device until its backward (autograd holds its weights); add "
                      "--use_gradient_checkpointing to save device memory")
            self._kept.add(index)

    def _after_forward(self, index: int, needs_backward: bool) -> None:
        if index not in self._kept:
            self._unload(index)

    def _on_backward_start(self, index: int) -> None:
        self._load(index)
        self._load(index - 1)

    def _on_recompute(self, index: int) -> None:
        self._on_backward_start(index)
        self._ensure(index)

    def _on_backward_done(self, index: int) -> None:
        if self._pending[index] == 0:
            self._unload(index)

    def _restore(self) -> None:
        for index in sorted(self._loaded):
            self._unload(index)
        for moved_list in self._moved.values():
            for moved in moved_list:
                moved.slot.bind(moved.host.to(moved.original_device, copy=True))
        self._moved.clear()


def create_offloader(model_or_blocks: nn.Module, config: BlockSwapConfig,
                     device: str | torch.device) -> BlockSwap | None:
    """Builds the block swap ``config`` asks for on a model's block list, or returns None when it is off.

    Call it once the LoRA is injected and before training; it places the model itself (resident parts on ``device``,
    swapped weights in host memory), so do not move the model with ``.to()`` afterwards: that would pull the host
    copies onto the device. ``remove()`` undoes everything.

    Args:
        model_or_blocks: A diffusers transformer (``QwenImageTransformer2DModel``: ``transformer_blocks``;
            ``WanTransformer3DModel``: ``blocks``) or an explicit ``nn.ModuleList``; with a list, only the blocks are
            placed.
        config: The block swap settings.
        device: The compute device.

    Raises:
        ValueError: No block list, more blocks to swap than blocks, or a trainable streamed weight (H2D-only).
    """
    if not config.enabled:
        return None
    device = resolve_device(device, "device")
    blocks, name = find_block_list(model_or_blocks)
    model = None if isinstance(model_or_blocks, nn.ModuleList) else model_or_blocks
    if config.h2d_only:
        from .h2d_stream import H2DOnlyBlockSwap  # it subclasses BlockSwap, so it imports this module

        return H2DOnlyBlockSwap(blocks, config, device, model, name)
    return ClassicBlockSwap(blocks, config, device, model, name)
