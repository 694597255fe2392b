"""The memory planner's predictions next to measurements, plan by plan, on this machine's device.

    python scripts/bench_planner.py                    # CPU: 2 Qwen-Image-shaped blocks, 256 image tokens
    python scripts/bench_planner.py --device cuda      # 8 blocks, 4096 image tokens (1024x1024)

A Qwen-Image-shaped transformer (the real block shapes, ``--num_blocks`` blocks, random bf16 weights, a rank-16 LoRA
on the attention projections) is predicted on the meta device for each plan (``core/planning``), then trained for a
few steps under that plan with the real engine. Printed per plan, predicted | measured: the weight bytes the policy
held on the device at once (its residency meter), the activation bytes autograd saved, on CUDA the peak allocated
memory (``torch.cuda.max_memory_allocated``, the prediction without context and allocator slack), and the median
step time; then whether the predicted step-time ranking of the plans is the measured one. The device's rates are
measured here first (one large copy, one BF16 product). On the CPU the "device" is host memory and nothing overlaps:
the memory columns check the predictions, the times only the mechanism.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from diffusers import QwenImageTransformer2DModel
from peft import LoraConfig, inject_adapter_in_model

from diffsynth.core.device import peak_memory_bytes, reset_peak_memory, resolve_device, synchronize
from diffsynth.core.gradient import gradient_checkpoint_forward
from diffsynth.core.offload_training import BlockSwapConfig, OffloadTrainingManager, create_offloader
from diffsynth.core.planning.footprint import measure_step
from diffsynth.core.planning.plans import Plan, Workload, predict
from diffsynth.core.planning.profiles import measure_device

MIB = 2**20


def build(num_blocks: int, device: str | torch.device) -> QwenImageTransformer2DModel:
    """The Qwen-Image-shaped transformer with its LoRA, on ``device`` (meta: weightless)."""
    torch.manual_seed(0)
    with torch.device(device):
        model = QwenImageTransformer2DModel(patch_size=2, in_channels=64, out_channels=16, num_layers=num_blocks,
                                            attention_head_dim=128, num_attention_heads=24, joint_attention_dim=3584,
                                            guidance_embeds=False, axes_dims_rope=(16, 56, 56)).to(torch.bfloat16)
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
    return dict(hidden_states=torch.randn(1, side * side, 64, generator=generator).to(device, torch.bfloat16),
                encoder_hidden_states=torch.randn(1, text_tokens, 3584, generator=generator).to(device, torch.bfloat16),
                encoder_hidden_states_mask=torch.ones(1, text_tokens, device=device),
                timestep=torch.tensor([0.5], device=device), img_shapes=[[(1, side, side)]], return_dict=False)


def set_checkpointing(model: torch.nn.Module, mode: str) -> None:
    if mode == "off":
        model.disable_gradient_checkpointing()
        return
    offload = mode == "offload"
    model.enable_gradient_checkpointing(
        gradient_checkpointing_func=lambda block, *args: gradient_checkpoint_forward(block, True, offload, *args))


def measure_plan(plan: Plan, args: argparse.Namespace, device: torch.device, base: torch.nn.Module) -> dict:
    """Trains ``args.steps`` steps under ``plan`` and returns what it held, saved, allocated and took."""
    model = copy.deepcopy(base)
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
    batch = inputs(args.image_tokens, args.text_tokens, device)
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
    # The saved activations of one more step, the offloaded weights' references excluded as the planner excludes them.
    saved = measure_step(model, lambda: model(**batch)[0].float().square().mean(), fused_attention=False).saved_bytes
    if isinstance(placed, OffloadTrainingManager):
        placed.after_backward()
    return dict(held=held, saved=saved, allocated=peak_memory_bytes(device), step=statistics.median(times[1:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--num_blocks", type=int, help="transformer blocks (default 8 on CUDA, 2 on the CPU)")
    parser.add_argument("--image_tokens", type=int, help="a square number (default 4096 on CUDA, 256 on the CPU)")
    parser.add_argument("--text_tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4, help="steps per plan; the first is not timed")
    args = parser.parse_args()
    device = resolve_device(args.device, "--device")
    cuda = device.type == "cuda"
    args.num_blocks = args.num_blocks or (8 if cuda else 2)
    args.image_tokens = args.image_tokens or (4096 if cuda else 256)
    torch.set_num_threads(1 if not cuda else torch.get_num_threads())
    half = max(1, args.num_blocks // 2)
    plans = [Plan("off", "device"), Plan("on", "device"), Plan("offload", "device"),
             Plan("on", "classic", half, pinned=cuda), Plan("on", "h2d", half, pinned=cuda),
             Plan("on", "offload", prefetch_depth=1 if cuda else 0)]
    meta = build(args.num_blocks, "meta")
    meta_inputs = inputs(args.image_tokens, args.text_tokens, "meta")
    workload = Workload(meta, meta.transformer_blocks, lambda: meta(**meta_inputs)[0].float().square().mean(),
                        lambda enabled: set_checkpointing(meta, "on" if enabled else "off"))
    profile = measure_device(device)
    base = build(args.num_blocks, "cpu")
    print(f"Qwen-Image-shaped DiT, {args.num_blocks} blocks, {args.image_tokens} image + {args.text_tokens} text "
          f"tokens, LoRA r16, on {device} ({profile.tflops:.1f} TFLOPS, {profile.h2d_gbps:.1f} GB/s measured)")
    print(f"{'plan':>36} | {'held MiB pred|meas':>19} | {'saved MiB pred|meas':>20} | "
          f"{'allocated MiB pred|meas':>24} | {'step s pred|meas':>17}")
    rows = []
    for plan in plans:
        predicted = predict(plan, workload, profile)
        measured = measure_plan(plan, args, device, base)
        saved_prediction = workload.footprint(plan.checkpointing != "off").saved_bytes
        allocated = f"{predicted.allocated_bytes / MIB:10.1f} | " + (
            f"{measured['allocated'] / MIB:10.1f}" if measured["allocated"] is not None else f"{'-':>10}")
        print(f"{plan.describe() + ', ckpt ' + plan.checkpointing:>36} | "
              f"{predicted.parts['moving weights'] / MIB:8.1f} | {measured['held'] / MIB:8.1f} | "
              f"{saved_prediction / MIB:8.1f} | {measured['saved'] / MIB:9.1f} | {allocated} | "
              f"{predicted.step_seconds:7.3f} | {measured['step']:7.3f}")
        rows.append((plan, predicted.step_seconds, measured["step"]))
    predicted_order = [plan.describe() + "/" + plan.checkpointing for plan, p, _ in sorted(rows, key=lambda r: r[1])]
    measured_order = [plan.describe() + "/" + plan.checkpointing for plan, _, m in sorted(rows, key=lambda r: r[2])]
    print("predicted ranking:", ", ".join(predicted_order))
    print("measured ranking: ", ", ".join(measured_order))
    print("same ranking" if predicted_order == measured_order else "rankings differ")


if __name__ == "__main__":
    main()
