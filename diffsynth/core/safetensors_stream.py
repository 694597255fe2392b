"""Writing a safetensors file tensor by tensor, so that a model larger than memory can be saved one piece at a time.

``safetensors.torch.save_file`` takes every tensor at once. The format itself needs only each tensor's name, dtype and
shape up front: an 8-byte little-endian header length, a JSON header giving every tensor's byte range, then the bytes
in that order. :class:`SafetensorsStream` writes the header from a plan and then the tensors as they come, so the
caller holds one tensor (or one block of tensors) at a time. The file it writes is read by ``safetensors`` itself and
every loader built on it.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

import torch

# safetensors' dtype codes (safetensors/src/tensor.rs, Dtype).
_DTYPE_CODES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint64: "U64", torch.uint32: "U32", torch.uint16: "U16", torch.uint8: "U8", torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2", torch.float8_e4m3fnuz: "F8_E4M3FNUZ",
    torch.float8_e5m2fnuz: "F8_E5M2FNUZ", torch.complex64: "C64",
}  # fmt: skip
_HEADER_ALIGNMENT = 8  # safetensors pads its header with spaces so the data starts 8-byte aligned


def planned_nbytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    """Bytes a tensor of ``shape`` and ``dtype`` takes in a safetensors file."""
    count = 1
    for size in shape:
        count *= int(size)
    return count * torch.empty((), dtype=dtype).element_size()


class SafetensorsStream:
    """One safetensors file, written from a plan of ``(name, shape, dtype)`` entries, then tensor by tensor in plan
    order.

    Args:
        path: The file to write (the caller makes it atomic, e.g. by writing into a staging folder).
        plan: Every tensor of the file, in the order its bytes will be written.
        metadata: The header's ``__metadata__`` entries (strings).

    Raises:
        ValueError: A dtype safetensors cannot store, or a duplicate name.
    """

    def __init__(self, path: str | os.PathLike, plan: Sequence[tuple[str, Sequence[int], torch.dtype]],
                 metadata: Mapping[str, str] | None = None) -> None:
        self.path = Path(path)
        self._plan = [(name, tuple(int(size) for size in shape), dtype) for name, shape, dtype in plan]
        if len({name for name, _, _ in self._plan}) != len(self._plan):
            raise ValueError(f"{self.path}: the plan names a tensor twice")
        header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
        offset = 0
        for name, shape, dtype in self._plan:
            if dtype not in _DTYPE_CODES:
                raise ValueError(f"{self.path}: tensor {name!r} has dtype {dtype}, which safetensors cannot store")
            size = planned_nbytes(shape, dtype)
            header[name] = {"dtype": _DTYPE_CODES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
            offset += size
        encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
        encoded += b" " * (-len(encoded) % _HEADER_ALIGNMENT)
        self._handle: BinaryIO | None = open(self.path, "wb")  # noqa: SIM115 (closed by close())
        self._handle.write(struct.pack("<Q", len(encoded)))
        self._handle.write(encoded)
        self._next = 0

    @property
    def complete(self) -> bool:
        """Whether every planned tensor has been written."""
        return self._next == len(self._plan)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Appends the bytes of the next planned tensor (on the CPU), which must match its planned shape and dtype.

        Raises:
            ValueError: ``name`` is not the next planned tensor, or its shape or dtype differs from the plan.
        """
        if self.complete:
            raise ValueError(f"{self.path}: {name!r} was not planned (every planned tensor is written)")
        expected, shape, dtype = self._plan[self._next]
        if name != expected or tuple(tensor.shape) != shape or tensor.dtype != dtype:
            raise ValueError(f"{self.path}: got {name!r} {tuple(tensor.shape)} {tensor.dtype}, but the next planned "
                             f"tensor is {expected!r} {shape} {dtype}")
        data = tensor.detach().to("cpu").contiguous().reshape(-1)
        if data.numel():
            self._handle.write(memoryview(data.view(torch.uint8).numpy()))
        self._next += 1

    def close(self) -> None:
        """Flushes the file to disk and closes it.

        Raises:
            ValueError: Planned tensors were not written (the file would be truncated).
        """
        if self._handle is None:
            return
        handle, self._handle = self._handle, None
        try:
            if not self.complete:
                raise ValueError(f"{self.path}: {len(self._plan) - self._next} planned tensor(s) were not written, "
                                 f"the first {self._plan[self._next][0]!r}")
            handle.flush()
            os.fsync(handle.fileno())
        finally:
            handle.close()
