"""Peak memory of a full fine-tuning step: plain vs fused backward+step (``--fused_optimizer_step``), AdamW vs
bitsandbytes' AdamW8bit.

    python scripts/bench_full_training_memory.py                # on CUDA if present, else on the CPU
    python scripts/bench_full_training_memory.py --layers 8 --device cpu

The model is a real diffusers ``QwenImageTransformer2DModel``, narrow but with full-size structure (default 4 blocks
of width 512: about 38M parameters, 150 MB in fp32), trained in full on a small input, so weights, gradients and
optimizer state dominate memory as they do in a real full fine-tune. Each configuration runs in its own process:

- on CUDA, the peak of ``torch.cuda.max_memory_allocated`` over the measured steps, minus the weights;
- on the CPU, the peak resident set (``VmHWM``, reset through ``/proc/self/clear_refs`` before the measured steps)
  minus the resident set before them. Large tensors are ``mmap``-ed and returned on free, so this follows the live
  tensors; it also counts the allocator's slack, so it is the coarser of the two.

One warm-up step runs first (the optimizer state exists from then on); two steps are measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CONFIGS = (("adamw", False), ("adamw", True), ("adamw8bit", False), ("adamw8bit", True))
MB = 1024 * 1024


def _rss_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _build(layers: int, width: int, device: str):
    import torch
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(0)
    heads = width // 64
    model = QwenImageTransformer2DModel(patch_size=2, in_channels=64, out_channels=16, num_layers=layers,
                                        attention_head_dim=64, num_attention_heads=heads, joint_attention_dim=width,
                                        guidance_embeds=False, axes_dims_rope=(16, 24, 24))
    return model.to(device).train()


def _inputs(width: int, device: str):
    import torch

    generator = torch.Generator().manual_seed(1)
    height = side = 8  # latent tokens after packing: 8 x 8
    return {"hidden_states": torch.randn(1, height * side, 64, generator=generator).to(device),
            "encoder_hidden_states": torch.randn(1, 16, width, generator=generator).to(device),
            "encoder_hidden_states_mask": torch.ones(1, 16, dtype=torch.long).to(device),
            "timestep": torch.tensor([0.5]).to(device), "img_shapes": [[(1, height, side)]], "return_dict": False}


def measure(optimizer_name: str, fused: bool, layers: int, width: int, device: str) -> dict:
    """One configuration's figures (run in a fresh process)."""
    import torch

    from diffsynth.training.loop.fused_step import FusedOptimizerStep

    torch.set_num_threads(1)
    model = _build(layers, width, device)
    params = [param for param in model.parameters() if param.requires_grad]
    if optimizer_name == "adamw8bit":
        import bitsandbytes as bnb

        optimizer = bnb.optim.AdamW8bit(params, lr=1e-5)
    else:
        optimizer = torch.optim.AdamW(params, lr=1e-5)
    fused_step = FusedOptimizerStep(optimizer, params) if fused else None
    inputs = _inputs(width, device)

    def step() -> None:
        output = model(**inputs)[0]
        loss = output.float().pow(2).mean()
        if fused_step is not None:
            fused_step.begin()
        loss.backward()
        if fused_step is None:
            optimizer.step()
        optimizer.zero_grad()

    step()  # warm-up: the optimizer state exists from here on
    weights = sum(param.numel() * param.element_size() for param in params)
    state = sum(value.numel() * value.element_size() for per_param in optimizer.state.values()
                for value in per_param.values() if torch.is_tensor(value))
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        for _ in range(2):
            step()
        torch.cuda.synchronize()
        above_weights = torch.cuda.max_memory_allocated() - weights
    else:
        before = _rss_bytes("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set
        for _ in range(2):
            step()
        # what the step adds on top of what is resident between steps (weights and optimizer state)
        above_weights = _rss_bytes("VmHWM") - before + state
    return {"optimizer": optimizer_name, "fused": fused, "params": sum(param.numel() for param in params),
            "weights_mb": weights / MB, "state_mb": state / MB, "peak_above_weights_mb": above_weights / MB}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4, help="Transformer blocks.")
    parser.add_argument("--width", type=int, default=512, help="Hidden size (a multiple of 64).")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None, help="Default: cuda if present.")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one configuration, print JSON
    args = parser.parse_args(argv)
    device = args.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.one:
        name, fused = args.one.split(":")
        print(json.dumps(measure(name, fused == "fused", args.layers, args.width, device)))
        return 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    rows = []
    for name, fused in CONFIGS:
        command = [sys.executable, __file__, "--layers", str(args.layers), "--width", str(args.width), "--device",
                   device, "--one", f"{name}:{'fused' if fused else 'plain'}"]
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    what = "max_memory_allocated" if device == "cuda" else "peak RSS (VmHWM) + optimizer state"
    print(f"device {device}; {rows[0]['params'] / 1e6:.1f}M parameters, weights {rows[0]['weights_mb']:.0f} MB; "
          f"memory above the weights at the step's peak ({what}):")
    print(f"{'optimizer':<10} {'step':<6} {'state MB':>9} {'peak above weights MB':>22} {'vs plain AdamW':>15}")
    base = rows[0]["peak_above_weights_mb"]
    for row in rows:
        print(f"{row['optimizer']:<10} {'fused' if row['fused'] else 'plain':<6} {row['state_mb']:>9.1f} "
              f"{row['peak_above_weights_mb']:>22.1f} {row['peak_above_weights_mb'] / base:>15.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
