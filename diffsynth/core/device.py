"""The one place that touches accelerator-only APIs (pinned memory, synchronisation, memory statistics).

Everything above this module takes a ``torch.device`` and calls these helpers, so the offload logic runs unchanged on
a CPU-only machine: pinned host memory falls back to pageable memory (said once in the log), synchronisation and
memory statistics become no-ops or zeros.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """Logs ``message`` at warning level the first time ``key`` is seen in this process."""
    if key not in _warned:
        _warned.add(key)
        logger.warning(message)


def resolve_device(device: str | torch.device, name: str = "device") -> torch.device:
    """Parses and checks a device argument.

    Args:
        device: A device string such as ``"cpu"``, ``"cuda"`` or ``"cuda:1"``, or a ``torch.device``.
        name: The argument's name, used in the error message.

    Returns:
        The device, with the current CUDA index filled in for a bare ``"cuda"`` and any CPU index dropped: CPU
        tensors report a bare ``cpu``, which never equals ``cpu:0`` (what accelerate gives each of several CPU
        processes), so a CPU device that kept its index would fail every ``tensor.device == device`` check.

    Raises:
        ValueError: The string is not a device, or names an accelerator that this machine does not have.
    """
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"{name}={device!r} is not a device; use 'cpu', 'cuda' or 'cuda:N' ({error})") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name}={device!r} but CUDA is not available on this machine; use 'cpu'")
        if resolved.index is None:
            resolved = torch.device("cuda", torch.cuda.current_device())
        if resolved.index >= torch.cuda.device_count():
            raise ValueError(f"{name}={device!r} but only {torch.cuda.device_count()} CUDA device(s) exist")
    elif resolved.type == "cpu":
        resolved = torch.device("cpu")
    elif resolved.type != "meta":
        raise ValueError(f"{name}={device!r}: only 'cpu' and 'cuda' devices are supported")
    return resolved


@functools.lru_cache(maxsize=None)
def pinned_memory_available() -> bool:
    """Whether page-locked host memory can be allocated (it needs a CUDA device)."""
    if not torch.cuda.is_available():
        return False
    try:
        torch.empty(1, dtype=torch.uint8, pin_memory=True)
    except RuntimeError:
        return False
    return True


def allocate_host_bytes(nbytes: int, pinned: bool = True) -> torch.Tensor:
    """Allocates a flat uint8 host buffer, page-locked when asked and possible.

    Pinned memory makes host-to-device copies asynchronous and about twice as fast, at the cost of memory the OS can
    never swap out. Where it cannot be had the buffer is pageable, and the fallback is logged once.
    """
    if pinned:
        if pinned_memory_available():
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        warn_once("pinned", "pinned host memory is unavailable (no CUDA device); falling back to pageable memory")
    return torch.empty(nbytes, dtype=torch.uint8)


_CUDA_HOST_REGISTER_PORTABLE = 1
"""``cudaHostRegisterPortable``: the memory counts as page-locked in every CUDA context of the process."""


def page_lock(tensor: torch.Tensor) -> bool:
    """Page-locks the host memory a contiguous CPU tensor already occupies (``cudaHostRegister``), in place.

    Unlike ``pin_memory()`` nothing is copied, so memory another process also maps (a shared segment) becomes pinned
    in this process too, and copies from it to the GPU become asynchronous. The memory must stay mapped until the
    process exits or ``page_unlock`` is called: the caller keeps the tensor alive. Returns whether it worked; without
    CUDA it does nothing and returns False (the caller logs the fallback).
    """
    if not torch.cuda.is_available():
        return False
    status = int(torch.cuda.cudart().cudaHostRegister(tensor.data_ptr(), tensor.numel() * tensor.element_size(),
                                                      _CUDA_HOST_REGISTER_PORTABLE))
    if status != 0:
        logger.warning("cudaHostRegister of %d bytes of shared host memory failed (cudaError %d); copies from it "
                       "stay synchronous", tensor.numel() * tensor.element_size(), status)
        return False
    return True


def page_unlock(tensor: torch.Tensor) -> None:
    """Undoes ``page_lock`` (``cudaHostUnregister``) before the memory is unmapped."""
    status = int(torch.cuda.cudart().cudaHostUnregister(tensor.data_ptr()))
    if status != 0:
        logger.warning("cudaHostUnregister failed (cudaError %d)", status)


def copy_to_host(tensor: torch.Tensor) -> torch.Tensor:
    """Returns a copy of ``tensor`` in host memory, started without waiting where the hardware allows.

    From an accelerator the copy goes into pinned memory with ``non_blocking``: it is ordered on the current stream,
    so a later copy back on the same stream sees complete data, and the host never stalls for it. Reading the copy on
    the host needs a ``synchronize`` first. Elsewhere it is a plain (blocking) copy.
    """
    if tensor.device.type == "cpu" or not pinned_memory_available():
        return tensor.to("cpu", copy=True)
    return copy_into(torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True), tensor)


def copy_to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Returns a new copy of ``tensor`` on ``device``, even when it is already there.

    The copy is non-blocking when the source is pinned and the target is an accelerator: it is ordered on the current
    stream, so kernels launched afterwards see the data. Always copying (also CPU to CPU) keeps the offload mechanics
    identical on every device, which is what lets the CPU tests exercise them.
    """
    return copy_into(torch.empty_like(tensor, device=device), tensor)


def copy_into(destination: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """Copies ``source`` into ``destination`` and returns it, without blocking the host where that is safe.

    A copy between the host and an accelerator is non-blocking when its host side is pinned: it is ordered on the
    current stream, so kernels launched afterwards see the data; reading a host destination needs the stream's work
    to be done first (an event or a ``synchronize``). Every other copy is a plain blocking one.
    """
    host = destination if destination.device.type == "cpu" else source
    crosses = destination.device.type != source.device.type
    destination.copy_(source, non_blocking=crosses and host.is_pinned())
    return destination


def available_host_memory() -> int | None:
    """Host memory this process could still take, in bytes: the kernel's ``MemAvailable``, or less when the
    process's cgroup (a container's limit, cgroup v2) leaves less; None where ``/proc/meminfo`` is missing."""
    try:
        with open("/proc/meminfo") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
    try:
        with open("/proc/self/cgroup") as cgroup:
            path = next(line.split("::", 1)[1].strip() for line in cgroup if line.startswith("0::"))
        folder = f"/sys/fs/cgroup{path}"
        with open(f"{folder}/memory.max") as limit, open(f"{folder}/memory.current") as used:
            maximum = limit.read().strip()
            if maximum != "max":
                available = min(available, int(maximum) - int(used.read()))
    except (OSError, StopIteration, ValueError):
        pass  # no cgroup v2 memory controller here: the kernel's figure stands
    return available


def synchronize(device: torch.device) -> None:
    """Waits for all work queued on ``device``; a no-op on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    """Starts a new peak-memory measurement on ``device``; a no-op on the CPU."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> int | None:
    """Peak bytes allocated on ``device`` since the last reset, or None where the device keeps no statistics."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return None


def new_stream(device: torch.device) -> Any:
    """A new side stream on ``device``, so copies can overlap compute; None on the CPU, which has no streams."""
    if device.type == "cuda":
        return torch.cuda.Stream(device=device)
    return None


def use_stream(stream: Any) -> contextlib.AbstractContextManager:
    """Makes ``stream`` current inside the ``with`` block; a no-op context for None (the CPU)."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def record_event(device: torch.device, enable_timing: bool = False) -> Any:
    """Records an event on the current stream of ``device`` and returns it; None on the CPU.

    Work queued on the stream before this call completes before the event does, so another stream that waits for it
    (``wait_event``) runs after that work; with ``enable_timing`` two events measure the GPU time between them.
    """
    if device.type != "cuda":
        return None
    event = torch.cuda.Event(enable_timing=enable_timing)
    event.record(torch.cuda.current_stream(device))
    return event


def wait_event(device: torch.device, event: Any) -> None:
    """Makes the current stream of ``device`` wait for ``event`` on the GPU (the host does not block); None: no-op."""
    if event is not None:
        torch.cuda.current_stream(device).wait_event(event)


def synchronize_event(event: Any) -> None:
    """Blocks the host until the work recorded before ``event`` has run; None (the CPU's event): returns at once."""
    if event is not None:
        event.synchronize()
