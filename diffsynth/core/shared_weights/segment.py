"""A block of memory that the processes of a run on one machine share: one host copy of the frozen weights.

With offload or block swap every process streams the same frozen weights from host memory; N processes on a machine
would otherwise hold N copies (a 20B model in bf16 is about 41 GB per process). The local main process loads the weights
once into a ``SharedSegment``; the other processes map the same physical pages.

Lifetime. The segment is an anonymous memory file (``memfd_create``): it has no name in any file system, so there is
nothing to remove. The other processes open it through ``/proc/<pid>/fd/<fd>`` of the local main process while that
still holds its descriptor (``SegmentOffer``), and every process maps it shared; then the main process closes the
descriptor. From there on the memory belongs to the mappings alone, and the kernel frees it when the last process
that maps it exits or drops it, whether the run ends normally, by an exception, or killed (``SIGKILL``, the OOM
killer): no run can leave a segment behind. A file in ``/dev/shm`` would outlive a crash, and containers often give
``/dev/shm`` only 64 MB; a memory file is limited only by the memory of the machine (and of the container's cgroup).

Recognition. Tensors that live in a segment are views of its storage; ``shared_storage`` recognises them, so offload
and block swap use them in place as host masters instead of copying them into an arena of their own.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from ..device import page_lock

logger = logging.getLogger(__name__)

SEGMENT_PREFIX = "diffsynth-weights"
"""Start of every segment's name, as ``/proc/<pid>/maps`` shows it (``/memfd:diffsynth-weights:<model> (deleted)``)."""

_SEGMENTS: dict[int, tuple[StorageWeakRef, str]] = {}
"""Live segments of this process by the address of their storage; the weak reference tells a live segment from a
later allocation at the same address."""
_PAGE_LOCKED: list[torch.Tensor] = []
"""Segments registered with CUDA stay mapped until the process exits: unmapping registered memory is undefined."""


def memory_files_supported() -> bool:
    """Whether this platform has anonymous memory files (Linux with ``memfd_create``) and ``/proc``."""
    return hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")


@dataclasses.dataclass(frozen=True)
class SegmentOffer:
    """What the other processes need to map a segment: the creator's process id and descriptor, and the size."""

    pid: int
    fd: int
    nbytes: int
    name: str

    @property
    def path(self) -> str:
        return f"/proc/{self.pid}/fd/{self.fd}"


class SharedSegment:
    """A shared mapping of one memory file: a flat ``uint8`` tensor every process of the machine sees the same bytes of.

    Build it with ``create`` (the local main process) or ``attach`` (the others); carve tensors out of it with
    ``tensor``.
    """

    def __init__(self, storage: torch.UntypedStorage, name: str, fd: int | None = None) -> None:
        self.flat = torch.empty(0, dtype=torch.uint8).set_(storage)
        self.name = name
        self.page_locked = False
        self._fd = fd
        for address in [address for address, (ref, _) in _SEGMENTS.items() if ref.expired()]:
            del _SEGMENTS[address]
        _SEGMENTS[storage.data_ptr()] = (StorageWeakRef(storage), name)

    @classmethod
    def create(cls, nbytes: int, name: str) -> SharedSegment:
        """Makes a memory file of ``nbytes`` (zero-filled, its pages allocated on first write) and maps it.

        Raises:
            OSError: The platform has no memory files, or the kernel refuses one.
        """
        if not memory_files_supported():
            raise OSError("this platform has no anonymous memory files (memfd_create, Linux 3.17+)")
        fd = os.memfd_create(f"{SEGMENT_PREFIX}:{name}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, nbytes)
            storage = torch.UntypedStorage.from_file(f"/proc/self/fd/{fd}", shared=True, nbytes=nbytes)
        except BaseException:
            os.close(fd)
            raise
        return cls(storage, name, fd)

    @classmethod
    def attach(cls, offer: SegmentOffer) -> SharedSegment:
        """Maps the segment another process of this machine created and still holds open.

        Raises:
            OSError: The creator's descriptor cannot be opened (another user, a ``/proc`` mounted without access).
        """
        try:
            storage = torch.UntypedStorage.from_file(offer.path, shared=True, nbytes=offer.nbytes)
        except RuntimeError as error:  # torch reports open and mmap failures as RuntimeError
            raise OSError(f"cannot map {offer.path} ({error})") from None
        return cls(storage, offer.name)

    @property
    def nbytes(self) -> int:
        return self.flat.numel()

    def offer(self) -> SegmentOffer:
        """How the other processes attach; only the creator can offer, until ``close_handle``."""
        if self._fd is None:
            raise RuntimeError(f"segment {self.name} was attached, not created here, or its handle is closed")
        return SegmentOffer(os.getpid(), self._fd, self.nbytes, self.name)

    def close_handle(self) -> None:
        """Closes the creator's descriptor once every process has mapped the segment: from then on the mappings alone
        keep the memory, and the kernel frees it with the last of them."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def tensor(self, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """A view of ``dtype`` and ``shape`` at byte ``offset`` (a multiple of the dtype's size)."""
        nbytes = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
        return self.flat[offset:offset + nbytes].view(dtype).view(shape)

    def lock_pages(self) -> bool:
        """Page-locks the segment in this process where CUDA is available (each process registers its own mapping),
        so copies from it to the GPU are asynchronous; returns whether it did. The mapping then stays until exit."""
        if not self.page_locked and self.nbytes and page_lock(self.flat):
            self.page_locked = True
            _PAGE_LOCKED.append(self.flat)
        return self.page_locked


def shared_storage(tensor: torch.Tensor) -> torch.Tensor | None:
    """The whole segment (a flat ``uint8`` tensor) that ``tensor`` lives in, or None for any other tensor."""
    if tensor.device.type != "cpu" or tensor.is_meta:
        return None
    storage = tensor.untyped_storage()
    entry = _SEGMENTS.get(storage.data_ptr())
    if entry is None or entry[0].expired():
        return None
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def is_shared_host(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` lives in a shared segment: a read-only host master already, to be used in place."""
    return shared_storage(tensor) is not None


def shared_span(tensors: list[torch.Tensor], offsets: list[int], nbytes: int) -> torch.Tensor | None:
    """The ``nbytes`` of one segment that hold ``tensors`` contiguously at byte ``offsets`` from the first, as a flat
    ``uint8`` view; None when they do not lie so (then the caller packs a copy).

    The shared loader lays a model's parameters out in module order at aligned offsets, so a block's frozen weights
    usually form such a span and stream to the device in one copy without a private host copy.
    """
    if not tensors:
        return None
    flat = shared_storage(tensors[0])
    if flat is None:
        return None
    base = flat.data_ptr()
    start = tensors[0].data_ptr() - base
    for tensor, offset in zip(tensors, offsets):
        if (not tensor.is_contiguous() or tensor.untyped_storage().data_ptr() != base
                or tensor.data_ptr() - base != start + offset):
            return None
    return flat[start:start + nbytes]
