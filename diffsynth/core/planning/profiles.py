"""Device profiles: memory, host-to-device bandwidth and matrix throughput of common GPUs, or of the one at hand.

The planner predicts step time from FLOPs at a throughput and from bytes moved at a bandwidth; a profile supplies
both, so a run can be planned for a card one does not have (``python -m diffsynth.plan --device_profile``). The
figures are the vendors' published peaks (dense BF16 tensor throughput with FP32 accumulation, memory size) and the
PCIe link's per-direction rate, with the share of each that a training step achieves stated beside them (assumed, not
measured: ``COMPUTE_EFFICIENCY``, ``LINK_EFFICIENCY``). ``measure_device`` measures both rates on the CUDA device
itself instead.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from ..device import allocate_host_bytes, synchronize

GIB = 1024**3

PCIE4_X16 = 32.0
"""GB/s per direction of a PCIe 4.0 x16 link (16 GT/s x 16 lanes, 128b/130b encoding): RTX 40 series, A100, L40S."""
PCIE5_X16 = 64.0
"""GB/s per direction of PCIe 5.0 x16 (32 GT/s): RTX 50 series, H100 and H200."""

COMPUTE_EFFICIENCY = 0.4
"""Assumed share of the peak dense throughput a diffusion transformer's training step achieves (attention, norms,
element-wise work and LoRA's thin products run below the large-matrix rate)."""
LINK_EFFICIENCY = 0.8
"""Assumed share of the link's peak that copies from pinned memory achieve (protocol overhead)."""
MEASURED_COMPUTE_EFFICIENCY = 0.55
"""Assumed share of a large BF16 matrix product's measured rate that a training step achieves."""
CUDA_CONTEXT_BYTES = int(0.75 * GIB)
"""Device memory the CUDA context and the math libraries' workspaces take before any tensor (assumed)."""
HOST_BASELINE_CPU_BYTES = 412 * 2**20
"""Host memory of a training process before any weight, on the CPU: Python with torch, diffusers, peft and diffsynth
imported and a batch built. Measured: the median resident memory of ``scripts/bench_planner.py``'s processes before
they build their model, 412 MiB on this project's CPU machine (docs Low_VRAM)."""
HOST_BASELINE_CUDA_BYTES = int(1.6 * GIB)
"""The same on a CUDA machine: the CPU's figure plus CUDA's host side (driver, runtime, cuBLAS and cuDNN code and
host buffers, about 1.2 GiB). An estimate, not yet measured here: ``scripts/bench_planner.py --device cuda`` prints
the measured figure; a one-process run reported in issue 31 (2,176 MiB measured, 549 MiB of it the weights' part the
planner predicts) implies 1.6 GiB."""


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """What the planner needs to know of a device.

    Attributes:
        name: Short name used on the command line.
        memory_bytes: Device memory.
        h2d_gbps: Host-to-device bandwidth in GB/s (10^9 bytes/s): the link's peak for a profile, measured for
            ``measure_device``.
        tflops: Dense BF16 matrix throughput in TFLOPS (peak for a profile, measured for ``measure_device``).
        source: Where the figures come from.
        compute_efficiency: Share of ``tflops`` a training step achieves.
        link_efficiency: Share of ``h2d_gbps`` a pinned copy achieves.
        context_bytes: Device memory taken before any tensor (the CUDA context; none on the CPU).
        host_baseline_bytes: Host memory of one training process before any weight (``HOST_BASELINE_*``).
    """

    name: str
    memory_bytes: int
    h2d_gbps: float
    tflops: float
    source: str
    compute_efficiency: float = COMPUTE_EFFICIENCY
    link_efficiency: float = LINK_EFFICIENCY
    context_bytes: int = CUDA_CONTEXT_BYTES
    host_baseline_bytes: int = HOST_BASELINE_CUDA_BYTES

    @property
    def flops_per_second(self) -> float:
        """What a training step achieves."""
        return self.tflops * 1e12 * self.compute_efficiency

    @property
    def bytes_per_second(self) -> float:
        """What a copy from pinned memory achieves."""
        return self.h2d_gbps * 1e9 * self.link_efficiency


PROFILES = {profile.name: profile for profile in (
    DeviceProfile("rtx4070-12gb", 12 * GIB, PCIE4_X16, 58.3,
                  "NVIDIA Ada Lovelace architecture whitepaper (GeForce RTX 4070: 12 GB GDDR6X, BF16 tensor with FP32 "
                  "accumulate, dense); PCIe 4.0 x16"),
    DeviceProfile("rtx4080-16gb", 16 * GIB, PCIE4_X16, 97.5,
                  "NVIDIA Ada Lovelace architecture whitepaper, appendix (GeForce RTX 4080: 16 GB, BF16 tensor with FP32 "
                  "accumulate 97.5 TFLOPS dense); PCIe 4.0 x16"),
    DeviceProfile("rtx4090-24gb", 24 * GIB, PCIE4_X16, 165.2,
                  "NVIDIA Ada Lovelace architecture whitepaper, appendix (GeForce RTX 4090: 24 GB, BF16 tensor with FP32 "
                  "accumulate 165.2 TFLOPS dense); PCIe 4.0 x16"),
    DeviceProfile("rtx5090-32gb", 32 * GIB, PCIE5_X16, 209.5,
                  "NVIDIA RTX Blackwell GPU architecture whitepaper, appendix (GeForce RTX 5090: 32 GB GDDR7, BF16 tensor "
                  "with FP32 accumulate 209.5 TFLOPS dense, 419 with sparsity); PCIe 5.0 x16"),
    DeviceProfile("l40s-48gb", 48 * GIB, PCIE4_X16, 362.05,
                  "NVIDIA L40S datasheet (48 GB GDDR6, BF16 tensor 362.05 TFLOPS dense, 733 with sparsity); PCIe 4.0 x16"),
    DeviceProfile("a100-80gb", 80 * GIB, PCIE4_X16, 312.0,
                  "NVIDIA A100 datasheet (80 GB HBM2e, BF16 tensor 312 TFLOPS dense, 624 with sparsity); PCIe 4.0 x16"),
    DeviceProfile("h100-80gb", 80 * GIB, PCIE5_X16, 989.0,
                  "NVIDIA H100 datasheet (SXM: 80 GB HBM3, BF16 tensor 1,979 TFLOPS with sparsity, half dense); PCIe 5.0 "
                  "x16"),
    DeviceProfile("h200-141gb", 141 * 10**9, PCIE5_X16, 989.0,
                  "NVIDIA H200 datasheet (SXM: 141 GB HBM3e, BF16 tensor 1,979 TFLOPS with sparsity, half dense); PCIe "
                  "5.0 x16"),
)}
"""The 12, 16, 24, 32, 48, 80 and 141 GB classes."""


def profile_named(name: str) -> DeviceProfile:
    """The profile called ``name``.

    Raises:
        ValueError: Unknown name; the message lists the known ones.
    """
    if name not in PROFILES:
        raise ValueError(f"--device_profile {name!r} is not a known device; choose one of {', '.join(PROFILES)}")
    return PROFILES[name]


def measure_device(device: torch.device, copy_bytes: int = 256 * 2**20, size: int = 4096) -> DeviceProfile:
    """Measures a device: one large (pinned) host-to-device copy, a BF16 matrix product, and on CUDA the free memory.

    Takes about a second. The throughput is what a large matrix product achieves, so the planner's efficiency applies
    on top of it as it does to a peak figure. On the CPU the "device" is host memory: its size is not measured (0),
    there is no context, and a copy is a memory copy (the figures exercise the planner, they do not speed it up).
    """
    cuda = device.type == "cuda"
    size = size if cuda else 1024
    host = allocate_host_bytes(copy_bytes, pinned=cuda)
    target = torch.empty(copy_bytes, dtype=torch.uint8, device=device)
    a = torch.randn(size, size, dtype=torch.bfloat16, device=device)
    best_copy = best_matmul = float("inf")
    for _ in range(3):
        synchronize(device)
        start = time.perf_counter()
        target.copy_(host, non_blocking=True)
        synchronize(device)
        best_copy = min(best_copy, time.perf_counter() - start)
        start = time.perf_counter()
        a @ a
        synchronize(device)
        best_matmul = min(best_matmul, time.perf_counter() - start)
    free = torch.cuda.mem_get_info(device)[0] if cuda else 0
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    return DeviceProfile(f"measured-{name}", free, copy_bytes / best_copy / 1e9, 2 * size**3 / best_matmul / 1e12,
                         "measured on this machine", compute_efficiency=MEASURED_COMPUTE_EFFICIENCY,
                         link_efficiency=1.0, context_bytes=CUDA_CONTEXT_BYTES if cuda else 0,
                         host_baseline_bytes=HOST_BASELINE_CUDA_BYTES if cuda else HOST_BASELINE_CPU_BYTES)
