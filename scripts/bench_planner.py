"""The memory planner's predictions next to measurements, plan by plan, on this machine's device.

    python scripts/bench_planner.py                    # CPU: 2 Qwen-Image-shaped blocks, 256 image tokens
    python scripts/bench_planner.py --device cuda      # 8 blocks, 4096 image tokens (1024x1024)

A Qwen-Image-shaped transformer (the real block shapes, ``--num_blocks`` blocks, random bf16 weights, a rank-16 LoRA
on the attention projections) is predicted on the meta device for each plan (``core/planning``), then trained for a
few steps under that plan with the real engine, each plan in a fresh process. Printed per plan, predicted |
measured: the weight bytes the policy held on the device at once (its residency meter), the activation bytes
autograd saved, on CUDA the peak allocated memory (``torch.cuda.max_memory_allocated``, the prediction without
context and allocator slack), the process's peak host memory (``VmHWM``: its resident peak, baseline included), and
the median step time; then whether the predicted step-time ranking of the plans is the measured one.

Each process also reads its resident memory once the libraries are imported and the batch is built, before any
weight exists: the per-process host baseline of this device kind, printed first as its median over the plans beside
the planner's figure (``HOST_BASELINE_CPU_BYTES`` / ``HOST_BASELINE_CUDA_BYTES``). The device's rates are measured
here first (one large copy, one BF16 product). On the CPU the "device" is host memory: the host column then compares
the process's peak with the planner's host memory plus the device bytes it allocates (the larger of that and the
moment the masters are built), and nothing overlaps, so the times check only the mechanism.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from diffusers import QwenImageTransformer2DModel
from peft import LoraConfig, inject_adapter_in_model

from diffsynth.core.device import peak_memory_bytes, reset_peak_memory, resolve_device, synchronize
from diffsynth.core.gradient import gradient_checkpoint_forward
from diffsynth.core.offload_training import BlockSwapConfig, OffloadTrainingManager, create_offloader
from diffsynth.core.planning.footprint import measure_step
from diffsynth.core.planning.plans import Plan, Prediction, Workload, predict
from diffsynth.core.planning.profiles import GIB, measure_device

MIB = 2**20


def build(num_blocks: int, device: str | torch.device) -> QwenImageTransformer2DModel:
    """The Qwen-Image-shaped transformer with its LoRA, on ``device`` (meta: weightless).

    Built in bf16 directly (not float32 and then converted), so that the host peak is the model's, as when it is
    loaded from bf16 files.
    """
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = QwenImageTransformer2DModel(patch_size=2, in_channels=64, out_channels=16, num_layers=num_blocks,
                                                attention_head_dim=128, num_attention_heads=24,
                                                joint_attention_dim=3584, guidance_embeds=False,
                                                axes_dims_rope=(16, 56, 56))
    finally:
        torch.set_default_dtype(default)
    model.requires_grad_(False)
    inject_adapter_in_model(LoraConfig(r=16, lora_alpha=16, target_modules=["to_q", "to_k", "to_v", "to_out.0"]),
                            model)
    for name, param in model.named_parameters():
        if ".lora_" in name:
            param.data = param.data.float()
            param.requires_grad_(True)
    return model


def inputs(image_tokens: int, text_tokens: int, device: str | torch.device) -> dict:
    side = int(image_tokens**0.5)
    generator = torch.Generator().manual_seed(1)
    return {"hidden_states": torch.randn(1, side * side, 64, generator=generator).to(device, torch.bfloat16),
                "encoder_hidden_states": torch.randn(1, text_tokens, 3584, generator=generator).to(device,
                                                                                                   torch.bfloat16),
                "encoder_hidden_states_mask": torch.ones(1, text_tokens, device=device),
                "timestep": torch.tensor([0.5], device=device), "img_shapes": [[(1, side, side)]], "return_dict": False}


def set_checkpointing(model: torch.nn.Module, mode: str) -> None:
    if mode == "off":
        model.disable_gradient_checkpointing()
        return
    offload = mode == "offload"
    model.enable_gradient_checkpointing(
        gradient_checkpointing_func=lambda block, *args: gradient_checkpoint_forward(block, True, offload, *args))


def resident_bytes(field: str) -> int:
    """A field of ``/proc/self/status`` (``VmRSS``: resident now, ``VmHWM``: resident peak), in bytes."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field + ":"))


def measure_plan(plan: Plan, args: argparse.Namespace, device: torch.device) -> dict:
    """Trains ``args.steps`` steps under ``plan`` in this (fresh) process and returns what it held, saved, allocated,
    took, and its host memory before any weight and at its peak."""
    batch = inputs(args.image_tokens, args.text_tokens, device)
    baseline = resident_bytes("VmRSS")
    model = build(args.num_blocks, "cpu")
    set_checkpointing(model, plan.checkpointing)
    placed = None
    if plan.policy == "device":
        model.to(device)
    elif plan.policy == "offload":
        placed = OffloadTrainingManager(model, device, prefetch_depth=plan.prefetch_depth)
    else:
        placed = create_offloader(model, BlockSwapConfig(plan.blocks_to_swap, h2d_only=plan.policy == "h2d",
                                                         ring_size=plan.ring_size,
                                                         use_pinned_memory=plan.pinned and device.type == "cuda"),
                                  device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    times = []
    for step in range(args.steps):
        if step == 1:
            reset_peak_memory(device)
        synchronize(device)
        start = time.perf_counter()
        model(**batch)[0].float().square().mean().backward()
        if isinstance(placed, OffloadTrainingManager):
            placed.after_backward()
        optimizer.step()
        optimizer.zero_grad()
        synchronize(device)
        times.append(time.perf_counter() - start)
    held = (placed.peak_resident_bytes if isinstance(placed, OffloadTrainingManager)
            else placed.peak_swapped_bytes if placed is not None else 0)
    host_peak = resident_bytes("VmHWM")  # before the measuring step below, whose hooks keep every saved tensor
    # The saved activations of one more step, the offloaded weights' references excluded as the planner excludes them.
    saved = measure_step(model, lambda: model(**batch)[0].float().square().mean(), fused_attention=False).saved_bytes
    if isinstance(placed, OffloadTrainingManager):
        placed.after_backward()
    return {"held": held, "saved": saved, "allocated": peak_memory_bytes(device), "step": statistics.median(times[1:]),
                "baseline": baseline, "host_peak": host_peak}


def measure_in_fresh_process(plan: Plan, args: argparse.Namespace) -> dict:
    """``measure_plan`` in a new process, so that its host peak is this plan's alone."""
    command = [sys.executable, __file__, "--device", args.device, "--num_blocks", str(args.num_blocks),
               "--image_tokens", str(args.image_tokens), "--text_tokens", str(args.text_tokens), "--steps",
               str(args.steps), "--worker", json.dumps(dataclasses.asdict(plan))]
    done = subprocess.run(command, capture_output=True, text=True, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    if done.returncode != 0:
        raise RuntimeError(f"measuring {plan.describe()} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def predicted_host_peak(predicted: Prediction, device: torch.device) -> int:
    """The host peak the planner predicts for one process; on the CPU its device bytes are host memory too."""
    if device.type == "cuda":
        return predicted.host_bytes
    parts = predicted.host_parts
    return parts["baseline"] + max(parts["building"], parts["training"] + predicted.allocated_bytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--num_blocks", type=int, help="transformer blocks (default 8 on CUDA, 2 on the CPU)")
    parser.add_argument("--image_tokens", type=int, help="a square number (default 4096 on CUDA, 256 on the CPU)")
    parser.add_argument("--text_tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4, help="steps per plan; the first is not timed")
    parser.add_argument("--host_baseline_gib", type=float,
                        help="predict with this per-process host baseline instead of the device kind's (3 was the "
                             "planner's figure before it was measured)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # one plan, measured in this process (JSON)
    args = parser.parse_args()
    device = resolve_device(args.device, "--device")
    cuda = device.type == "cuda"
    args.num_blocks = args.num_blocks or (8 if cuda else 2)
    args.image_tokens = args.image_tokens or (4096 if cuda else 256)
    torch.set_num_threads(1 if not cuda else torch.get_num_threads())
    if args.worker:
        print(json.dumps(measure_plan(Plan(**json.loads(args.worker)), args, device)))
        return
    half = max(1, args.num_blocks // 2)
    plans = [Plan("off", "device"), Plan("on", "device"), Plan("offload", "device"),
             Plan("on", "classic", half, pinned=cuda), Plan("on", "h2d", half, pinned=cuda),
             Plan("on", "offload", prefetch_depth=1 if cuda else 0)]
    meta = build(args.num_blocks, "meta")
    meta_inputs = inputs(args.image_tokens, args.text_tokens, "meta")
    workload = Workload(meta, meta.transformer_blocks, lambda: meta(**meta_inputs)[0].float().square().mean(),
                        lambda enabled: set_checkpointing(meta, "on" if enabled else "off"))
    profile = measure_device(device)
    if args.host_baseline_gib is not None:
        profile = dataclasses.replace(profile, host_baseline_bytes=int(args.host_baseline_gib * GIB))
    print(f"Qwen-Image-shaped DiT, {args.num_blocks} blocks, {args.image_tokens} image + {args.text_tokens} text "
          f"tokens, LoRA r16, on {device} ({profile.tflops:.1f} TFLOPS, {profile.h2d_gbps:.1f} GB/s measured)")
    print(f"{'plan':>36} | {'held MiB pred|meas':>19} | {'saved MiB pred|meas':>20} | "
          f"{'allocated MiB pred|meas':>24} | {'host peak MiB pred|meas':>24} | {'step s pred|meas':>17}")
    rows, baselines = [], []
    for plan in plans:
        predicted = predict(plan, workload, profile)
        measured = measure_in_fresh_process(plan, args)
        baselines.append(measured["baseline"])
        saved_prediction = workload.footprint(plan.checkpointing != "off").saved_bytes
        allocated = f"{predicted.allocated_bytes / MIB:10.1f} | " + (
            f"{measured['allocated'] / MIB:10.1f}" if measured["allocated"] is not None else f"{'-':>10}")
        host = predicted_host_peak(predicted, device)
        print(f"{plan.describe() + ', ckpt ' + plan.checkpointing:>36} | "
              f"{predicted.parts['moving weights'] / MIB:8.1f} | {measured['held'] / MIB:8.1f} | "
              f"{saved_prediction / MIB:8.1f} | {measured['saved'] / MIB:9.1f} | {allocated} | "
              f"{host / MIB:8.0f} | {measured['host_peak'] / MIB:8.0f} ({host / measured['host_peak']:4.2f}x) | "
              f"{predicted.step_seconds:7.3f} | {measured['step']:7.3f}")
        rows.append((plan, predicted.step_seconds, measured["step"]))
    print(f"host baseline per process (before any weight), median over the plans: "
          f"{statistics.median(baselines) / MIB:.0f} MiB measured, {profile.host_baseline_bytes / MIB:.0f} MiB "
          "predicted")
    predicted_order = [plan.describe() + "/" + plan.checkpointing for plan, p, _ in sorted(rows, key=lambda r: r[1])]
    measured_order = [plan.describe() + "/" + plan.checkpointing for plan, _, m in sorted(rows, key=lambda r: r[2])]
    print("predicted ranking:", ", ".join(predicted_order))
    print("measured ranking: ", ", ".join(measured_order))
    print("same ranking" if predicted_order == measured_order else "rankings differ")


if __name__ == "__main__":
    main()
