"""Step time and memory of offload training against plain training, measured in one run.

    python scripts/bench_offload.py                     # CPU: small ToyModel
    python scripts/bench_offload.py --device cuda       # the seeds' sizes: 10 x Linear(4096, 4096), batch 512

Modes: plain (everything on the device), offload (frozen layers streamed, trainable layers on the device) and
optimizer_offload (every layer streamed, optimizer on the host). The first ``--frozen_layers`` layers are frozen, so
the offload mode has something to stream. Memory is the peak allocated CUDA memory on a GPU; on the CPU it is the
peak bytes of weights the manager had copied to the device (all weights for plain training).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "offload_training"))
from toy_model import ToyModel, train  # noqa: E402

from diffsynth.core.device import resolve_device  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dim", type=int, help="layer width (default: 4096 on CUDA, 512 on the CPU)")
    parser.add_argument("--num_layers", type=int, default=10)
    parser.add_argument("--frozen_layers", type=int, default=5, help="how many leading layers are frozen")
    parser.add_argument("--batch", type=int, help="rows per step (default: 512 on CUDA, 128 on the CPU)")
    parser.add_argument("--steps", type=int, default=12, help="measured steps; the first two are warm-up")
    args = parser.parse_args()
    device = resolve_device(args.device, "--device")
    dim = args.dim or (4096 if device.type == "cuda" else 512)
    batch = args.batch or (512 if device.type == "cuda" else 128)

    results = {}
    for mode in ("plain", "offload", "optimizer_offload"):
        torch.manual_seed(0)
        model = ToyModel(dim, args.num_layers)
        model.layers[: args.frozen_layers].requires_grad_(False)
        results[mode] = train(model, device, args.steps, batch, mode, progress=False)

    plain_time = statistics.median(results["plain"]["times"][2:])
    memory_kind = "peak CUDA memory" if device.type == "cuda" else "peak weight bytes on device"
    print(f"ToyModel dim={dim} layers={args.num_layers} frozen={args.frozen_layers} batch={batch} on {device}")
    print(f"{'mode':>18} | {'median step':>11} | {'vs plain':>8} | {memory_kind}")
    for mode, result in results.items():
        step = statistics.median(result["times"][2:])
        memory = result["peak_device_bytes"] if device.type == "cuda" else result["peak_resident_bytes"]
        print(f"{mode:>18} | {step * 1e3:8.2f} ms | {step / plain_time:7.2f}x | {memory / 2**20:10.1f} MiB")
    final = {mode: result["losses"][-1] for mode, result in results.items()}
    print("final losses:", ", ".join(f"{mode} {loss:.6f}" for mode, loss in final.items()))


if __name__ == "__main__":
    main()
