"""Offload training in your own loop: the seeds' ToyModel, trained with and without ``OffloadTrainingManager``.

    python examples/offload_training/toy_model.py                   # CPU, small sizes, both runs
    python examples/offload_training/toy_model.py --device cuda     # the seeds' sizes: 10 x Linear(4096, 4096)

The integration is three lines: keep the model on the CPU, build the manager instead of ``model.to(device)``, and
call ``manager.after_backward()`` between ``backward()`` and ``optimizer.step()``.
"""

from __future__ import annotations

import argparse
import time

import torch
from tqdm import tqdm

from diffsynth.core import OffloadTrainingManager
from diffsynth.core.device import peak_memory_bytes, reset_peak_memory, resolve_device, synchronize


class ToyModel(torch.nn.Module):
    def __init__(self, dim: int, num_layers: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer(torch.nn.functional.layer_norm(x, x.shape[-1:]))
        return x


def train(model: ToyModel, device: torch.device, steps: int, batch: int, mode: str, seed: int = 0,
          progress: bool = True) -> dict:
    """Trains ``model`` for ``steps`` AdamW steps in ``mode`` ('plain', 'offload' or 'optimizer_offload').

    Returns:
        The losses, the per-step times in seconds, the peak device memory (None on the CPU) and the peak bytes of
        weights on the device (the manager's accounting; all weights in plain mode).
    """
    manager = None
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    # Without optimizer offload, trainable weights sit on the device for good (not counted by the manager).
    kept_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    kept_bytes = kept_bytes if mode == "offload" else 0
    if mode == "plain":
        model.to(device)
    else:
        manager = OffloadTrainingManager(model, device, enable_optimizer_cpu_offload=mode == "optimizer_offload")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    generator = torch.Generator().manual_seed(seed)
    dim = model.layers[0].in_features
    reset_peak_memory(device)
    losses, times = [], []
    for _ in tqdm(range(steps), disable=not progress, desc=mode):
        start = time.perf_counter()
        x = torch.randn((batch, dim), generator=generator).to(device)
        loss = torch.nn.functional.mse_loss(model(x), x + 1)
        loss.backward()
        if manager is not None:
            manager.after_backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        synchronize(device)
        times.append(time.perf_counter() - start)
    result = dict(losses=losses, times=times, peak_device_bytes=peak_memory_bytes(device),
                  peak_resident_bytes=weight_bytes if manager is None else manager.peak_resident_bytes + kept_bytes)
    if manager is not None:
        manager.remove()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="compute device: cpu or cuda")
    parser.add_argument("--dim", type=int, help="layer width (default: 4096 on CUDA, 256 on the CPU)")
    parser.add_argument("--num_layers", type=int, default=10)
    parser.add_argument("--batch", type=int, help="rows per step (default: 512 on CUDA, 64 on the CPU)")
    parser.add_argument("--steps", type=int, help="training steps (default: 100 on CUDA, 20 on the CPU)")
    args = parser.parse_args()
    device = resolve_device(args.device, "--device")
    on_gpu = device.type == "cuda"
    dim = args.dim or (4096 if on_gpu else 256)
    batch = args.batch or (512 if on_gpu else 64)
    steps = args.steps or (100 if on_gpu else 20)

    for mode in ("plain", "optimizer_offload"):
        torch.manual_seed(0)
        result = train(ToyModel(dim, args.num_layers), device, steps, batch, mode)
        memory = (f"peak device memory {result['peak_device_bytes'] / 2**30:.2f} GiB" if on_gpu else
                  f"peak weight bytes on the device {result['peak_resident_bytes'] / 2**20:.2f} MiB")
        print(f"{mode:>18}: first loss {result['losses'][0]:.4f}, last loss {result['losses'][-1]:.4f}, {memory}")


if __name__ == "__main__":
    main()
