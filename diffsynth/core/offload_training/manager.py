"""``OffloadTrainingManager``: train a model whose weights live in host memory, one unit on the device at a time.

The manager plans offload units (``placement.py``), gives every tensor an offloader (``offloader.py``) with its host
master in a pinned arena (``memory_buffer.py``) and its device copies in reused buffers (``device_pool.py``), and
hands the units to the residency driver (``hooks.py``) with the leaf-offload policy (``leaf_offload.py``), which
prefetches along the recorded order (``prefetch.py``).

While the root module runs, a saved-tensor hook replaces every weight that autograd saves for backward by a small
reference that is resolved against the reloaded copy in backward. Without it, autograd's saved views (``weight.t()``
in ``linear``) would keep every unit's device copy alive until backward, and the device would end up holding the
whole model even though each unit was unloaded.

Call ``after_backward()`` after every backward and before ``optimizer.step()``: it unloads what is still loaded and
hands the host gradients of optimizer-offloaded parameters to ``param.grad``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import torch

from ..device import resolve_device, synchronize
from .device_pool import DeviceBufferPool, DevicePoolStats, recurring_sizes
from .grad_sync import GradientSynchronizer, distributed_world_size
from .hooks import ResidencyDriver, ResidencyMeter
from .leaf_offload import LeafOffloadPolicy, OffloadUnit
from .memory_buffer import BaseBufferPool, PinnedArenaPool, frozen_tensors, tensor_nbytes
from .offloader import (
    AlwaysOnDeviceParamOffloader,
    BufferOffloader,
    StaticParamOffloader,
    TensorOffloader,
    TrainableParamOffloader,
)
from .placement import UnitSpec, plan_units
from .prefetch import PrefetchScheduler, PrefetchStats
from .transfer import make_engine

logger = logging.getLogger(__name__)

MB = 1024 * 1024


@dataclasses.dataclass
class OffloadTrainingConfig:
    """What the manager does (the arguments of ``OffloadTrainingManager``), checked at construction; a None
    ``prefetch_depth`` is resolved here (1 on CUDA, 0 elsewhere: without a copy stream nothing could overlap)."""

    target_device: str | torch.device
    enable_optimizer_cpu_offload: bool = False
    cpu_offload_split_threshold: float | None = None
    prefetch_depth: int | None = None
    reuse_device_buffers: bool = True

    def __post_init__(self) -> None:
        self.target_device = resolve_device(self.target_device, "target_device")
        depth = self.prefetch_depth
        if depth is None:
            self.prefetch_depth = 1 if self.target_device.type == "cuda" else 0
        elif isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise ValueError(f"prefetch_depth={depth!r} must be a whole number of units to copy ahead (0 turns "
                             "prefetch off, 1 or 2 overlap copies with compute), or None for 1 on CUDA and 0 "
                             "elsewhere")
        if not isinstance(self.reuse_device_buffers, bool):
            raise ValueError(f"reuse_device_buffers={self.reuse_device_buffers!r} must be True or False")
        threshold = self.cpu_offload_split_threshold
        if threshold is not None and (isinstance(threshold, bool) or not threshold > 0):
            raise ValueError(f"cpu_offload_split_threshold={threshold!r} must be a positive size in MB "
                             "(--cpu_offload_split_threshold), or None for one unit per leaf module")

    @property
    def split_threshold_bytes(self) -> int | None:
        if self.cpu_offload_split_threshold is None:
            return None
        return int(self.cpu_offload_split_threshold * MB)


class _SavedWeight:
    """What autograd keeps instead of a weight's device copy: its offloader and where in the copy the saved view is."""

    __slots__ = ("offloader", "size", "storage_offset", "stride")

    def __init__(self, offloader: TensorOffloader, tensor: torch.Tensor) -> None:
        self.offloader = offloader
        self.size, self.stride, self.storage_offset = tensor.size(), tensor.stride(), tensor.storage_offset()


class OffloadTrainingManager:
    """Keeps a model's weights in host memory and moves each unit to the compute device only while it computes.

    Args:
        model: The model, normally on the CPU. Frozen parameters and buffers move into host masters; trainable
            parameters stay on the device, or on the host with ``enable_optimizer_cpu_offload``.
        target_device: The compute device (``"cuda"``, ``"cuda:1"``, or ``"cpu"`` to run the mechanism on the CPU).
        enable_optimizer_cpu_offload: Also keep trainable weights on the host, so the optimizer and its state run
            there. Saves device memory for full fine-tuning; costs a transfer of each trainable weight per pass and
            a host optimizer step.
        cpu_offload_split_threshold: In MB. None (default) makes one unit per leaf module: the least device memory,
            the most transfers. A threshold keeps modules up to that size whole: fewer, larger transfers, more memory.
        pool: Where host masters live; by default a pinned arena planned from the model.
        prefetch_depth: K: from the second pass on, the next K units' weights are copied on a copy stream while the
            current unit computes, so compute waits for copies only when they are slower. Costs device memory for
            up to K more units (the K largest at worst). 0 turns it off; None (default) is 1 on CUDA and 0 on the
            CPU (which has no copy stream; K > 0 runs the same schedule there with plain copies).
        reuse_device_buffers: Copy weights into device buffers kept and lent again on later loads (default; see
            ``device_pool.py``): no allocation per load after the first passes, for holding per weight size as many
            buffers as were ever in flight at once. False allocates every copy (and frees it on unload).

    Raises:
        ValueError: A bad device, threshold or prefetch depth, or optimizer offload on a model with nothing to train.
    """

    def __init__(self, model: torch.nn.Module, target_device: str | torch.device,
                 enable_optimizer_cpu_offload: bool = False, cpu_offload_split_threshold: float | None = None,
                 pool: BaseBufferPool | None = None, prefetch_depth: int | None = None,
                 reuse_device_buffers: bool = True) -> None:
        self.config = OffloadTrainingConfig(target_device, enable_optimizer_cpu_offload, cpu_offload_split_threshold,
                                            prefetch_depth, reuse_device_buffers)
        if enable_optimizer_cpu_offload and not any(p.requires_grad for p in model.parameters()):
            raise ValueError("enable_optimizer_cpu_offload=True but the model has no trainable parameter; make some "
                             "parameters trainable (or inject a LoRA) first, or drop --enable_optimizer_cpu_offload")
        self.model = model
        self.device = self.config.target_device
        self.meter = ResidencyMeter()
        trainable_copies = 2 if enable_optimizer_cpu_offload else 0  # master and gradient staging
        self.pool = pool if pool is not None else PinnedArenaPool.from_model(model, trainable_copies=trainable_copies)
        moved = frozen_tensors(model) + ([p for p in model.parameters() if p.requires_grad]
                                         if enable_optimizer_cpu_offload else [])
        self.device_pool = DeviceBufferPool(self.device, recurring_sizes(moved)) if reuse_device_buffers else None
        placement = plan_units(model, self.config.split_threshold_bytes)
        self._buffer_keys: dict[tuple[int, str], int] = {}
        self._offloaders = self._make_offloaders(placement.units, placement.resident)
        units = [OffloadUnit(spec.name, spec.module, self._offloaders_of(spec)) for spec in placement.units]
        # A unit whose tensors all stay on the device (a LoRA's own layers) moves nothing: it is not hooked at all.
        self.units = [unit for unit in units if any(o.counts_toward_residency for o in unit.offloaders)]
        self._resident = self._offloaders_of(placement.resident)
        for offloader in self._resident:
            offloader.onload()
        if self._resident:
            logger.info("%d tensor(s) held directly by the root module stay on %s", len(self._resident), self.device)
        # Offloaded models are not wrapped by DDP, so the manager averages their gradients itself.
        trainable = [param for param in model.parameters() if param.requires_grad]
        self._grad_sync = GradientSynchronizer(trainable) if trainable and distributed_world_size() > 1 else None
        self._loaded_on_demand: list[TensorOffloader] = []
        self._host_step_hooks: list[torch.utils.hooks.RemovableHandle] = []
        self._prefetch = self._make_prefetch_scheduler()
        self.policy = LeafOffloadPolicy(self.units, self._prefetch)
        # Meta tensors (a planner's dry run) have no addresses to recognise weights by, and free nothing anyway.
        saved = None if self.device.type == "meta" else (self._pack_saved_weight, self._resolve_saved_weight)
        self.driver = ResidencyDriver([unit.module for unit in self.units], self.policy, root=model,
                                      saved_tensor_hooks=saved)

    # ---- construction -------------------------------------------------------------------------------------------

    def _make_offloaders(self, units: list[UnitSpec], resident: UnitSpec) -> dict[int, TensorOffloader]:
        specs = [*units, resident]
        # A resident tensor is loaded once for good, so an optimizer-offloaded one would never publish its gradient:
        # trainable tensors the root module holds directly stay on the device instead.
        resident_params = {id(param) for param in resident.params}
        params = {id(param): param for spec in specs for param in spec.params}
        buffers: dict[int, tuple[torch.Tensor, list[tuple[torch.nn.Module, str]]]] = {}
        for spec in specs:
            for module, name in spec.buffers:
                tensor = module._buffers[name]
                self._buffer_keys[(id(module), name)] = id(tensor)
                slots = buffers.setdefault(id(tensor), (tensor, []))[1]
                if (module, name) not in slots:
                    slots.append((module, name))
        offloaders: dict[int, TensorOffloader] = {}
        frozen = [p for p in params.values() if not p.requires_grad] + [b for b, _ in buffers.values()]
        # Largest first: the order in which the arena was planned, so every master lands in its planned slot.
        for tensor in sorted(frozen, key=tensor_nbytes, reverse=True):
            if isinstance(tensor, torch.nn.Parameter):
                offloaders[id(tensor)] = StaticParamOffloader(tensor, self.device, self.meter, self.pool,
                                                              self.device_pool)
            else:
                offloaders[id(tensor)] = BufferOffloader(tensor, buffers[id(tensor)][1], self.device, self.meter,
                                                         self.pool, self.device_pool)
        for param in params.values():
            if not param.requires_grad:
                continue
            if self.config.enable_optimizer_cpu_offload and id(param) not in resident_params:
                offloaders[id(param)] = TrainableParamOffloader(param, self.device, self.meter, self.pool,
                                                                self.device_pool)
            else:
                offloaders[id(param)] = AlwaysOnDeviceParamOffloader(param, self.device, self.meter)
        return offloaders

    def _offloaders_of(self, spec: UnitSpec) -> list[TensorOffloader]:
        ids = [id(p) for p in spec.params] + [self._buffer_keys[(id(module), name)] for module, name in spec.buffers]
        return [self._offloaders[i] for i in dict.fromkeys(ids)]

    def _make_prefetch_scheduler(self) -> PrefetchScheduler | None:
        depth = self.config.prefetch_depth
        if not depth:
            return None
        if self.device.type != "cuda":
            logger.info("offload prefetch (depth %d) on %s: no copy stream, so prefetched weights are copied at once "
                        "(the schedule runs, nothing overlaps)", depth, self.device)
        # Without a copy stream whole units are copied with torch's (threaded) copy, as an unprefetched load is.
        engine = make_engine("direct" if self.device.type == "cuda" else "sync", self.device, pinned_masters=True,
                             threaded_host_copy=True)
        return PrefetchScheduler(self.units, depth, engine)

    # ---- saved weights ------------------------------------------------------------------------------------------

    def _pack_saved_weight(self, tensor: torch.Tensor) -> _SavedWeight | None:
        """A reference to the offloader whose device copy ``tensor`` views, or None for any other tensor."""
        # Runs for every tensor autograd saves (activations too): the address lookup first, the rest on a hit.
        if tensor.layout != torch.strided:
            return None
        offloader = self.meter.copies.get(tensor.untyped_storage().data_ptr())
        if offloader is None or offloader.device_copy.dtype != tensor.dtype or tensor.device != self.device:
            return None
        return _SavedWeight(offloader, tensor)

    def _resolve_saved_weight(self, saved: _SavedWeight) -> torch.Tensor:
        offloader = saved.offloader
        if offloader.device_copy is None:
            offloader.onload()
            self._loaded_on_demand.append(offloader)
        else:
            offloader.wait_for_copy()
        return offloader.device_copy.as_strided(saved.size, saved.stride, saved.storage_offset)

    # ---- public API ---------------------------------------------------------------------------------------------

    def after_backward(self, sync_gradients: bool = True) -> None:
        """Ends a backward pass: unloads every unit and moves the gradients of host-trained weights to ``.grad``.

        Call it after each ``backward()`` and before ``optimizer.step()``. Called with no backward since the last
        call it changes nothing (a documented no-op).

        Args:
            sync_gradients: In a multi-process run, average the trainable gradients across processes now. Pass False
                on the micro-steps of gradient accumulation that end without an optimizer step (accelerate's
                ``accelerator.sync_gradients``), so the all-reduce runs once per optimizer step.
        """
        self.policy.end_pass()
        self.driver.reset()
        for offloader in self._loaded_on_demand:
            offloader.offload()
        self._loaded_on_demand.clear()
        if self.config.enable_optimizer_cpu_offload:
            # The optimizer is about to write the host masters, which asynchronous copies (prefetches, dropped ones
            # included) may still be reading, and to read the gradients still being copied back: wait for all.
            synchronize(self.device)
            for offloader in self._offloaders.values():
                if isinstance(offloader, TrainableParamOffloader):
                    offloader.publish_grad()
        if sync_gradients and self._grad_sync is not None:
            self._grad_sync.all_reduce_mean()

    def register_host_steps(self, step: Callable[[torch.nn.Parameter], None]) -> list[torch.nn.Parameter]:
        """The fused optimizer step for the host-trained weights (``enable_optimizer_cpu_offload``).

        ``step(param)`` runs in backward as soon as each such weight's gradient has reached the host, on the host
        master with the host gradient as ``.grad``, which is dropped after: the host never holds every gradient at
        once. Costs one wait per weight for its gradient's copy (no overlap of that copy with later backward work).

        Returns:
            The parameters covered; the others (trained on the device) keep their gradients in ``.grad``.
        """
        covered = []
        for offloader in self._offloaders.values():
            if isinstance(offloader, TrainableParamOffloader):
                # Registered after the offloader's own hook, which moves the gradient to the host first.
                self._host_step_hooks.append(offloader.param.register_post_accumulate_grad_hook(
                    lambda _param, offloader=offloader: offloader.step_on_host(step)))
                covered.append(offloader.param)
        return covered

    @property
    def resident_bytes(self) -> int:
        """Bytes of weights and buffers currently copied to the device by this manager (moved per use)."""
        return self.meter.current

    @property
    def peak_resident_bytes(self) -> int:
        """The most ``resident_bytes`` has been since construction or ``reset_peak_resident_bytes()``."""
        return self.meter.peak

    def reset_peak_resident_bytes(self) -> None:
        self.meter.reset_peak()

    @property
    def device_pool_stats(self) -> DevicePoolStats | None:
        """Device buffer allocations, reuses and escapes so far; None when ``reuse_device_buffers`` is off."""
        return self.device_pool.stats if self.device_pool is not None else None

    @property
    def prefetch_stats(self) -> PrefetchStats | None:
        """Prefetch hits, misses, drops and order changes so far; None when prefetch is off."""
        return self._prefetch.stats if self._prefetch is not None else None

    def execution_order(self) -> list[tuple[str, str]]:
        """The recorded order of the last full pass, ``(phase, unit name)`` per event; empty without prefetch."""
        return self._prefetch.recorded_order() if self._prefetch is not None else []

    def live_device_copy_bytes(self) -> int:
        """Bytes of device copies still alive anywhere, autograd's saved tensors included (a diagnostic)."""
        return sum(o.live_copy_bytes() for o in self._offloaders.values())

    def remove(self) -> None:
        """Detaches every hook and turns every parameter and buffer back into an ordinary tensor.

        Tensors go back to the device they were on when the manager was built; host gradients are kept.
        """
        self.after_backward()  # ends the prefetch pass too
        if self._prefetch is not None:
            self._prefetch.engine.close()
        for offloader in self._resident:
            offloader.offload()
        self.driver.remove()
        for handle in self._host_step_hooks:
            handle.remove()
        self._host_step_hooks.clear()
        for offloader in self._offloaders.values():
            offloader.restore()
        self._offloaders.clear()
        self.units.clear()
        if self.device_pool is not None:
            self.device_pool.release_free()
