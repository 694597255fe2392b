"""Loading a model's frozen weights once per machine into shared memory, for the run's processes there to share.

Every process builds the model on the meta device and plans its checkpoint keys as usual; the parameters that
``SharedLoad.select`` names are then laid out in one ``SharedSegment`` (in module order, each at a 64-byte aligned
offset, so a block's weights form one span that block swap streams in a single copy). The steps, in every process of
the run in the same order (three collectives, also on machines where nothing is shared):

1. the local main process makes the segment and offers it; the others map it (``SegmentOffer``);
2. once every local process reports its mapping, the main process closes its handle (the kernel now frees the memory
   with the last mapping: see ``segment.py``), reads the shards into the segment one tensor at a time (cast to the
   model's dtype, quantized to fp8 for ``--fp8_models``), and tells the others whether it succeeded. They wait by
   watching a status word at the start of the segment (and that the main process is alive), not in a collective:
   a collective would time out on a slow disk (NCCL's default is 10 minutes);
3. every process points those parameters at views of the segment, and loads what is left (buffers, unselected
   parameters) on its own.

No process holds a second copy of a shared weight at any time: the main process reads one tensor beyond the segment,
the others read none. Where sharing cannot work (no memory files on the platform, a process cannot map the segment,
one process on the machine) every process loads its own copy as usual, and the main process says why in one line.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

import torch

from ..device import available_host_memory
from ..folder_lock import process_alive
from ..fp8 import Fp8Linear, store_model_in_fp8
from ..fp8_conv import is_fp8_conv
from ..offload_training.memory_buffer import align
from ..shared_weights import LocalGroup, SegmentOffer, SharedSegment
from .errors import ModelLoadError
from .state_dict import CheckpointEntry, keeps_fp32, planned_by_file, read_planned

logger = logging.getLogger(__name__)


HEADER_BYTES = 64
"""The segment starts with the status of its filling (an int32), then the weights at 64-byte aligned offsets."""
_FILLING, _FILLED, _FAILED = 0, 1, 2
POLL_SECONDS = 0.05


def format_bytes(nbytes: int) -> str:
    """``nbytes`` in GiB, or in MiB below one GiB, for log lines."""
    return f"{nbytes / 1024**3:.2f} GiB" if nbytes >= 1024**3 else f"{nbytes / 1024**2:.1f} MiB"


@dataclasses.dataclass(frozen=True)
class SharedLoad:
    """How one model's frozen weights are loaded into the machine's shared copy.

    Args:
        group: The run's processes on this machine (every process of the run loads the model together).
        select: Given the model built on the meta device, a test of parameter names that go into the shared copy
            (e.g. only the blocks block swap keeps in host memory); None shares every parameter.
        fp8: Store the frozen Linear and convolution weights in float8 (``--fp8_models``), so the shared copy is
            the fp8 one; the model is converted on the meta device before loading, as ``store_model_in_fp8`` would
            convert it after.
    """

    group: LocalGroup
    select: Callable[[torch.nn.Module], Callable[[str], bool]] | None = None
    fp8: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.group, LocalGroup):
            raise ValueError(f"group={self.group!r} must be a LocalGroup (LocalGroup.of_this_process())")


@dataclasses.dataclass(frozen=True)
class SegmentSlot:
    """Where one parameter lives in the segment."""

    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def plan_segment(model: torch.nn.Module, names: list[str], start: int = 0) -> tuple[dict[str, SegmentSlot], int]:
    """Lays the named (meta) parameters out in the given order from byte ``start``, each at a 64-byte aligned offset.

    Returns:
        ``({name: slot}, total bytes)``.
    """
    params = dict(model.named_parameters(remove_duplicate=False))
    slots, end = {}, start
    for name in names:
        param = params[name]
        offset = align(end)
        slots[name] = SegmentSlot(offset, param.dtype, tuple(param.shape))
        end = offset + param.numel() * param.element_size()
    return slots, end


def _fp8_scales(model: torch.nn.Module) -> dict[str, str]:
    """``{weight key: scale key}`` of every fp8 layer (Linear or convolution): the checkpoint's weight fills both."""
    return {f"{name}.weight": f"{name}.weight_scale" for name, module in model.named_modules()
            if isinstance(module, Fp8Linear) or is_fp8_conv(module)}


def _cast_meta_parameters(model: torch.nn.Module, dtype: torch.dtype, fp32_modules: tuple[str, ...]) -> None:
    """Gives every floating meta parameter the dtype it will be stored in (float32 inside the modules the class keeps
    in float32, as ``read_planned`` casts it), so the segment's layout and fp8 scales follow the loaded model."""
    for module_name, module in model.named_modules():
        for attr, param in module._parameters.items():
            if param is None or not param.is_meta or not param.is_floating_point():
                continue
            stored = torch.float32 if keeps_fp32(f"{module_name}.{attr}".lstrip("."), fp32_modules) else dtype
            if param.dtype != stored:
                module._parameters[attr] = torch.nn.Parameter(param.to(stored), requires_grad=param.requires_grad)


def _shared_names(model: torch.nn.Module, plan: dict[str, CheckpointEntry], request: SharedLoad) -> list[str]:
    """The parameters to put in the segment, in module order: selected ones the checkpoint fills."""
    select = request.select(model) if request.select is not None else None
    scales = _fp8_scales(model)
    filled = set(plan) | {scales[key] for key in plan if key in scales}
    return [name for name, _ in model.named_parameters(remove_duplicate=False)
            if name in filled and (select is None or select(name))]


def _fill(segment: SharedSegment, model: torch.nn.Module, plan: dict[str, CheckpointEntry],
          slots: dict[str, SegmentSlot], dtype: torch.dtype, fp32_modules: tuple[str, ...]) -> None:
    scales = _fp8_scales(model)
    for file, keys in planned_by_file(plan).items():
        for key, tensor in read_planned(file, keys, dtype, fp32_modules):
            if key in scales:
                tensor, scale = model.get_submodule(key.rsplit(".", 1)[0]).quantize_weight(tensor)
                scale_slot = slots[scales[key]]
                segment.tensor(scale_slot.offset, scale_slot.dtype, scale_slot.shape).copy_(scale)
            slot = slots[key]
            segment.tensor(slot.offset, slot.dtype, slot.shape).copy_(tensor)


def _wait_for_fill(segment: SharedSegment, owner: int, description: str) -> None:
    """Waits until the local main process has filled the segment, or failed, or exited."""
    status = segment.tensor(0, torch.int32, (1,))
    while int(status[0]) == _FILLING:
        if not process_alive(owner):
            raise ModelLoadError(f"the local main process (pid {owner}) exited while loading {description} into "
                                 "shared memory; see its error")
        time.sleep(POLL_SECONDS)


def _offer(group: LocalGroup, nbytes: int, description: str) -> tuple[SharedSegment | None, object]:
    """Step 1 on the local main process: the segment and what to broadcast (its offer, or why there is none)."""
    if group.size == 1:
        return None, None  # alone on this machine: nothing to share, nothing to say
    if nbytes == 0:
        return None, None
    available = available_host_memory()
    if available is not None and nbytes > available:
        logger.warning("sharing %s of %s weights among the %d processes on this machine, but only %s of memory is "
                       "available: loading may run out of memory (per-process copies would need %d times as much)",
                       format_bytes(nbytes), description, group.size, format_bytes(available), group.size)
    try:
        segment = SharedSegment.create(nbytes, description)
    except OSError as error:
        return None, f"no shared memory here ({error})"
    return segment, segment.offer()


def load_shared(model: torch.nn.Module, plan: dict[str, CheckpointEntry], dtype: torch.dtype,
                fp32_modules: tuple[str, ...], request: SharedLoad) -> dict[str, CheckpointEntry]:
    """Loads the selected planned parameters of ``model`` into the machine's shared copy (see the module docstring).

    Args:
        model: The model built on the meta device (converted to fp8 here first with ``request.fp8``).
        plan: ``{model_key: entry}`` from ``plan_keys``.
        dtype: The model's dtype.
        fp32_modules: Modules the class keeps in float32.
        request: What to share, with which processes.

    Returns:
        The part of ``plan`` still to load per process: what was not shared (all of it when sharing fell back).

    Raises:
        ModelLoadError: The local main process failed to read the checkpoint (every process raises it).
    """
    group, description = request.group, type(model).__name__
    _cast_meta_parameters(model, dtype, fp32_modules)
    if request.fp8:
        model.requires_grad_(False)  # fp8 storage is for frozen weights, as --fp8_models makes them
        store_model_in_fp8(model)  # as the training module would convert the loaded model
    names = _shared_names(model, plan, request)
    slots, nbytes = plan_segment(model, names, start=HEADER_BYTES) if names else ({}, 0)
    segment, offer = _offer(group, nbytes, description) if group.is_main else (None, None)
    offer = group.from_main(offer)
    attach_error = None
    if isinstance(offer, SegmentOffer) and not group.is_main:
        try:
            segment = SharedSegment.attach(offer)
        except OSError as error:
            attach_error = f"process {group.global_rank} cannot map it ({error})"
    attach_errors = [error for error in group.gather(attach_error) if error is not None]
    if segment is not None and group.is_main:
        segment.close_handle()  # every local process has mapped it (or given up): the mappings alone keep it now
    shared = isinstance(offer, SegmentOffer) and not attach_errors
    failure: Exception | None = None
    if shared and group.is_main:
        try:
            _fill(segment, model, {key: plan[key] for key in names if key in plan}, slots, dtype, fp32_modules)
        except Exception as error:  # noqa: BLE001 - every process must learn of it, or the others wait forever
            failure = error
        segment.tensor(0, torch.int32, (1,)).fill_(_FAILED if failure is not None else _FILLED)
    elif shared:
        _wait_for_fill(segment, offer.pid, description)
    failed = group.from_main(None if failure is None else f"{type(failure).__name__}: {failure}")
    if failure is not None:
        raise failure
    if failed is not None:
        raise ModelLoadError(f"the local main process failed to load {description} into shared memory: {failed}")
    if not shared:
        reason = offer if isinstance(offer, str) else (attach_errors[0] if attach_errors else None)
        if reason is not None and group.is_main:
            logger.warning("shared host weights off for %s: %s; each of the %d processes on this machine loads its "
                           "own copy (%s each)", description, reason, group.size, format_bytes(nbytes))
        return plan
    views = {name: segment.tensor(slot.offset, slot.dtype, slot.shape) for name, slot in slots.items()}
    model.load_state_dict(views, strict=False, assign=True)
    params = dict(model.named_parameters(remove_duplicate=False))
    for name in slots:
        params[name].requires_grad_(False)  # every process reads these bytes: an update by one would reach all
    locked = segment.lock_pages()
    if group.is_main:
        logger.info("loaded %s of %s weights once for the %d processes on this machine (shared memory%s)",
                    format_bytes(nbytes), description, group.size, ", page-locked" if locked else "")
    return {key: entry for key, entry in plan.items() if key not in slots}
