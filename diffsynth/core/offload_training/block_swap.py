"""Block swap: run or train a transformer whose blocks do not fit on the device, a few blocks at a time.

The blocks are one sequence in execution order (``BlockSequence``), from one list or several chained
(``BLOCK_SEQUENCES``: FLUX's double-stream blocks, then its single-stream ones); block counts and indices count over
the whole sequence.

Two policies on the residency driver (``hooks.py``), so model forward loops need no change and diffusers' gradient
checkpointing composes (a block re-run inside backward is a recompute):

- ``ClassicBlockSwap`` (``classic_swap.py``, exchange): the last ``blocks_to_swap`` blocks live in host memory; each
  is copied to the device just before it runs and back out after it. Any block, any training; a copy each way per
  block and pass.
- ``H2DOnlyBlockSwap`` (``h2d_stream.py``, ``h2d_only``), for a frozen base: evenly spaced blocks stream their frozen
  weights, packed into one flat (pinned) host master per block, through a ring of device slots allocated once;
  nothing is copied back. Needs gradient checkpointing to train.

This module holds their configuration, the base class with the public API, and ``create_offloader``. Copies go
through a transfer engine (``transfer.py``); ``remove()`` restores the model.

Host masters: frozen weights loaded into the machine's shared host copy (``core/shared_weights``; the loader puts the
blocks ``BlockSwapConfig.host_block_indices`` names there, see ``host_parameters``) are used in place, never copied
into a private arena nor written back; other tensors get a private master as before.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from ..device import allocate_host_bytes, resolve_device, synchronize
from ..shared_weights import is_shared_host
from .grad_sync import GradientSynchronizer, distributed_world_size
from .hooks import ResidencyDriver, ResidencyMeter, ResidencyPolicy
from .memory_buffer import PinnedArenaPool
from .transfer import DEFAULT_STAGING_BYTES, ENGINES, TensorSlot, TransferTimer, make_engine, tensor_slots

logger = logging.getLogger(__name__)

BLOCK_LIST_NAMES = ("transformer_blocks", "blocks", "layers")
"""Attributes searched for a single block list: Qwen-Image's ``transformer_blocks``, Wan's ``blocks``, Z-Image's
``layers`` (its refiner blocks stay resident)."""

BLOCK_SEQUENCES: tuple[tuple[str, ...], ...] = (
    ("transformer_blocks", "single_transformer_blocks"),
    ("vace_blocks", "blocks"),
    *((name,) for name in BLOCK_LIST_NAMES),
)
"""Which block lists are swapped as one sequence, tried in order: the first entry whose lists the model all has (as
non-empty ``ModuleList`` attributes) wins, its lists chained in the order given, which must be the order the model
runs them. FLUX.1's ``FluxTransformer2DModel`` and FLUX.2's ``Flux2Transformer2DModel`` run their double-stream
``transformer_blocks`` and then their ``single_transformer_blocks`` (most of the weights); a transformer with a control
branch (diffusers' ``WanVACETransformer3DModel``) runs all its ``vace_blocks``, whose outputs are hints, before its
``blocks``; every other model has one list (``BLOCK_LIST_NAMES``), so it swaps as before."""


@dataclasses.dataclass(frozen=True)
class BlockSequence(Sequence):
    """The blocks block swap manages, in execution order, possibly from several lists, with each one's full name.

    Indices (``blocks_to_swap``, streamed indices, trace events) count over the whole sequence.

    Args:
        blocks: The blocks, in the order the model runs them.
        names: Each block's qualified name in its model (``"single_transformer_blocks.3"``): its parameters are
            named ``<name>.<path>``.
        list_names: The lists the blocks come from, in order (``("transformer_blocks", "single_transformer_blocks")``).
    """

    blocks: tuple[nn.Module, ...]
    names: tuple[str, ...]
    list_names: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.blocks) != len(self.names):
            raise ValueError(f"a block sequence needs one name per block: {len(self.blocks)} blocks, "
                             f"{len(self.names)} names")

    @classmethod
    def of_lists(cls, *lists: tuple[str, nn.ModuleList]) -> BlockSequence:
        """The blocks of ``(name, list)`` pairs, chained in the given order."""
        blocks = tuple(block for _, blocks in lists for block in blocks)
        names = tuple(f"{name}.{index}" for name, blocks in lists for index in range(len(blocks)))
        return cls(blocks, names, tuple(name for name, _ in lists))

    @property
    def label(self) -> str:
        """The lists, for messages: ``transformer_blocks + single_transformer_blocks``."""
        return " + ".join(self.list_names)

    def prefixes(self, indices: Iterable[int]) -> tuple[str, ...]:
        """Parameter-name prefixes of the blocks at ``indices`` (``"single_transformer_blocks.3."``)."""
        return tuple(f"{self.names[index]}." for index in indices)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int | slice) -> nn.Module | tuple[nn.Module, ...]:
        return self.blocks[index]

    def __iter__(self) -> Iterator[nn.Module]:
        return iter(self.blocks)


@dataclasses.dataclass
class BlockSwapConfig:
    """How block swap runs, checked at construction; errors name the flag, the value and the fix.

    Args:
        blocks_to_swap: Blocks kept off the device (``--blocks_to_swap``); 0 turns block swap off.
        h2d_only: Stream frozen weights through a device ring instead of exchanging blocks (``--block_swap_h2d_only``).
        ring_size: Device slots of the H2D-only ring (``--block_swap_ring_size``): 2 overlaps a copy with compute, 1
            uses the least memory, more absorbs uneven block times; clamped to the streamed count.
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

    def host_block_indices(self, num_blocks: int) -> list[int]:
        """The blocks whose weights live in host memory: the last ``blocks_to_swap`` (classic), or evenly spaced ones
        (H2D-only)."""
        if self.h2d_only:
            return streaming_block_indices(num_blocks, self.blocks_to_swap)
        return list(range(num_blocks - self.blocks_to_swap, num_blocks))


NO_CHECKPOINTING_MESSAGE = (
    "--block_swap_h2d_only needs --use_gradient_checkpointing to train: it reuses a few device slots for the streamed "
    "weights, and without checkpointing autograd would keep references to slot memory that is overwritten before "
    "backward. Add --use_gradient_checkpointing (model.enable_gradient_checkpointing()), or drop "
    "--block_swap_h2d_only for classic block swap")


def _check_count(name: str, value: Any, flag: str | None, minimum: int, meaning: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        where = f" ({flag})" if flag else ""
        raise ValueError(f"{name}={value!r}{where} must be {meaning}")


def find_block_sequence(model_or_blocks: nn.Module) -> BlockSequence:
    """The blocks of a diffusers transformer block swap manages, as one sequence in execution order.

    The first entry of ``BLOCK_SEQUENCES`` whose lists the model has wins: FLUX's ``transformer_blocks`` then
    ``single_transformer_blocks``; else one of ``transformer_blocks``, ``blocks``, ``layers``. A given ``ModuleList``
    is the sequence itself, named ``blocks``.

    Raises:
        ValueError: No non-empty ``ModuleList`` under those names; the message names the model class.
    """
    if isinstance(model_or_blocks, nn.ModuleList):
        return BlockSequence.of_lists(("blocks", model_or_blocks))
    for names in BLOCK_SEQUENCES:
        lists = [(name, getattr(model_or_blocks, name, None)) for name in names]
        if all(isinstance(blocks, nn.ModuleList) and len(blocks) > 0 for _, blocks in lists):
            return BlockSequence.of_lists(*lists)
    raise ValueError(f"block swap found no block list on {type(model_or_blocks).__name__}: it looks for a non-empty "
                     f"nn.ModuleList named {' or '.join(BLOCK_LIST_NAMES)}; pass the block list itself "
                     "(create_offloader(model.<blocks>, ...)) or turn block swap off (--blocks_to_swap 0)")


def find_block_list(model_or_blocks: nn.Module) -> tuple[BlockSequence, str]:
    """``find_block_sequence`` and its lists' label (``"transformer_blocks + single_transformer_blocks"``), for
    callers that unpack ``blocks, name``: ``blocks`` is the whole sequence, every list of it.

    Raises:
        ValueError: No block list (see ``find_block_sequence``).
    """
    sequence = find_block_sequence(model_or_blocks)
    return sequence, sequence.label


def streaming_block_indices(num_blocks: int, count: int) -> list[int]:
    """``count`` block indices spread evenly over ``num_blocks`` (the midpoint of each of ``count`` equal spans).

    Evenly spaced streamed blocks leave resident blocks between them whose compute hides the next block's copy.
    """
    return [((2 * k + 1) * num_blocks) // (2 * count) for k in range(count)]


def host_parameters(config: BlockSwapConfig):
    """For the loader: given a model (built on the meta device), a test of the parameter names block swap keeps in
    host memory, the weights of ``config.host_block_indices`` (no model is swapped without a block list)."""

    def select(model: nn.Module):
        blocks = find_block_sequence(model)
        prefixes = blocks.prefixes(config.host_block_indices(len(blocks)))
        return lambda parameter: parameter.startswith(prefixes)

    return select


def is_adapter_parameter(name: str) -> bool:
    """Whether a parameter belongs to a peft adapter (a ``lora_*`` module or vector), which is never streamed."""
    return any(part.startswith("lora_") for part in name.split("."))


class BlockSwap(ResidencyPolicy):
    """What both policies share: checks, host masters, placement of the other tensors, engine, driver, public API.

    Args:
        blocks: The blocks, in execution order: a ``BlockSequence`` (``find_block_sequence``; several lists chained)
            or one list.
        config: The checked configuration.
        device: The compute device.
        model: The model owning the blocks; its other tensors are placed on the device too. None: only the blocks are.
        list_name: The list's attribute name, for messages and tensor names, when ``blocks`` is one bare list.
    """

    mode_name = "block swap"

    def __init__(self, blocks: BlockSequence | nn.ModuleList, config: BlockSwapConfig, device: torch.device,
                 model: nn.Module | None = None, list_name: str = "blocks") -> None:
        if not isinstance(blocks, BlockSequence):
            blocks = BlockSequence.of_lists((list_name, blocks))
        if not config.enabled:
            raise ValueError("blocks_to_swap=0 turns block swap off: use create_offloader, which returns None then")
        if config.blocks_to_swap > len(blocks):
            owner = type(model).__name__ + "." if model is not None else ""
            raise ValueError(f"blocks_to_swap={config.blocks_to_swap} (--blocks_to_swap) but {owner}{blocks.label} "
                             f"has only {len(blocks)} blocks; use at most {len(blocks)}")
        self.blocks, self.config, self.device, self.model = blocks, config, device, model
        self.list_name = blocks.label
        self.num_blocks = len(blocks)
        # What owns every tensor this policy places: the model, or (given bare blocks) a container of the blocks.
        self._root = model if model is not None else nn.ModuleList(blocks)
        self.timer = TransferTimer() if config.debug_timing else None
        self.meter = ResidencyMeter()
        self.self_heals = 0
        self._masters: list[tuple[TensorSlot, torch.Tensor, torch.device]] = []
        self._placed: list[tuple[TensorSlot, torch.device]] = []
        self.engine = None
        self.driver: ResidencyDriver | None = None
        # No DDP wraps a model whose weights move, so its trainable gradients are averaged here (after_backward).
        trainable = [param for param in self._root.parameters() if param.requires_grad]
        self._grad_sync = GradientSynchronizer(trainable) if trainable and distributed_world_size() > 1 else None

    def _host_pool(self, sizes: list[int]) -> PinnedArenaPool:
        """One host arena for the masters, pinned with ``use_pinned_memory``."""
        return PinnedArenaPool(sizes, allocator=functools.partial(allocate_host_bytes,
                                                                  pinned=self.config.use_pinned_memory))

    def _keep_on_host(self, slot: TensorSlot, master: torch.Tensor) -> None:
        """Binds ``slot`` to its host ``master`` (already filled) until ``remove()`` makes it ordinary again."""
        self._masters.append((slot, master, slot.get().device))
        slot.bind(master)

    def _start(self, staging_bytes: int) -> None:
        """Places every unmanaged tensor on the device, builds the engine and hands the blocks to the driver."""
        managed = {id(slot.get()) for slot, _, _ in self._masters}
        for slot in tensor_slots(self._root, ""):
            tensor = slot.get()
            if id(tensor) not in managed and tensor.device != self.device:
                self._placed.append((slot, tensor.device))
                slot.bind(tensor.data.to(self.device))
                if slot.is_param and slot.get().grad is not None:
                    slot.get().grad = slot.get().grad.to(self.device)
        # Staging buffers as large as one block's copy, up to a cap (larger copies go through in chunks): they are
        # pinned, and keeping few small pinned buffers is the point of the staged engine. Masters in a shared copy
        # page-locked by the loader are pinned without --use_pinned_memory_for_block_swap.
        pinned = self.config.use_pinned_memory or all(master.is_pinned() for _, master, _ in self._masters)
        self.engine = make_engine(self.config.engine, self.device, pinned,
                                  self.config.num_staging_buffers,
                                  min(max(1, staging_bytes), DEFAULT_STAGING_BYTES), self.timer)
        self.engine_name = self.engine.name
        # The model's own pre-hook starts a pass, so the first loads overlap the embeddings.
        self.driver = ResidencyDriver(list(self.blocks), self, root=self.model, record_trace=self.config.record_trace)

    @property
    def trace(self) -> list[tuple] | None:
        """The driver's events and ``("load"|"evict", block, slot)``, ``("self_heal", block)``; None untraced."""
        return self.driver.trace if self.driver is not None else None

    def _record(self, *event: Any) -> None:
        if self.driver is not None:
            self.driver.record(*event)

    def _self_heal(self, index: int) -> None:
        """Counts a block needed but never prefetched (cold start, blocks called out of order); it loads on the spot."""
        self._record("self_heal", index)
        self.self_heals += 1
        if self.timer is not None:
            self.timer.of(index).self_heals += 1

    def _evict_all(self) -> None:
        """Moves every loaded block out, before ``remove()`` restores the masters."""

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

    def after_backward(self, sync_gradients: bool = True) -> None:
        """Ends a backward pass: with several processes and ``sync_gradients`` (the micro-step that ends an optimizer
        step), averages the model's trainable gradients across them. Call it before ``optimizer.step()``."""
        if sync_gradients and self._grad_sync is not None:
            self._grad_sync.all_reduce_mean()

    def remove(self) -> None:
        """Detaches the hooks and turns every moved tensor back into an ordinary tensor on its original device."""
        if self.engine is None:
            return
        # Both the copy stream and the compute stream (classic copies out on it) must be idle before host reads.
        self.engine.synchronize()
        synchronize(self.device)
        if self.timer is not None:
            self.timer.resolve()
        self.driver.remove()
        self._evict_all()
        for slot, master, device in self._masters:
            # A shared master goes back in place: a private copy per process would undo the sharing.
            slot.bind(master if device.type == "cpu" and is_shared_host(master) else master.to(device, copy=True))
        for slot, device in self._placed:
            slot.bind(slot.get().data.to(device))
            if slot.is_param and slot.get().grad is not None:
                slot.get().grad = slot.get().grad.to(device)
        self._placed.clear()
        self.engine.close()
        self.engine = None

def create_offloader(model_or_blocks: nn.Module, config: BlockSwapConfig,
                     device: str | torch.device) -> BlockSwap | None:
    """Builds the block swap ``config`` asks for on a model's blocks, or returns None when it is off.

    Call it once the LoRA is injected and before training; it places the model itself (resident parts on ``device``,
    swapped weights in host memory), so do not move the model with ``.to()`` afterwards: that would pull the host
    copies onto the device. ``remove()`` undoes everything.

    Args:
        model_or_blocks: A diffusers transformer (``QwenImageTransformer2DModel``: ``transformer_blocks``;
            ``WanTransformer3DModel``: ``blocks``; ``Flux2Transformer2DModel``: ``transformer_blocks`` then
            ``single_transformer_blocks``, one sequence, see ``BLOCK_SEQUENCES``) or an explicit ``nn.ModuleList``;
            with a list, only the blocks are placed.
        config: The block swap settings.
        device: The compute device.

    Raises:
        ValueError: No block list, more blocks to swap than blocks, or a trainable streamed weight (H2D-only).
    """
    if not config.enabled:
        return None
    device = resolve_device(device, "device")
    blocks = find_block_sequence(model_or_blocks)
    model = None if isinstance(model_or_blocks, nn.ModuleList) else model_or_blocks
    # The policies subclass BlockSwap, so they import this module.
    if config.h2d_only:
        from .h2d_stream import H2DOnlyBlockSwap

        return H2DOnlyBlockSwap(blocks, config, device, model)
    from .classic_swap import ClassicBlockSwap

    return ClassicBlockSwap(blocks, config, device, model)
