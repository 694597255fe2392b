"""Step time, memory and transfer bandwidth of offload training against plain training, measured in one run.

    python scripts/bench_offload.py                                  # CPU: 1 Qwen-Image block, 256 image tokens
    python scripts/bench_offload.py --device cuda                    # 16 blocks, 4096 image tokens (1024x1024), bf16
    python scripts/bench_offload.py --device cuda --num_blocks 60 --prefetch_depths 1,2,3
    python scripts/bench_offload.py --model toy [--device cuda]      # the seeds' ToyModel

``--model qwen-image`` (default): diffusers' ``QwenImageTransformer2DModel`` with the real block shapes (hidden 3072,
24 heads of 128, MLP 12288, modulation 6 x 3072, text width 3584), ``--num_blocks`` blocks and random weights, a
frozen base with a rank-16 LoRA on the trainer's usual targets, gradient checkpointing on. Modes: ``plain`` (the
model on the device), ``offload K=0`` (each unit copied right before use, on the compute stream) and ``offload K=k``
for each prefetch depth (the next k units copied on a copy stream while the current one computes), all with the
device buffer pool, and the deepest once more without it (``no pool``: every copy allocated afresh). Reported per mode:
median step time and its ratio to plain, peak CUDA memory (on the CPU: the manager's peak weight bytes), weight bytes
moved per step, the achieved host-to-device rate (bytes moved / step time) against the copy engine's peak measured here
with one large pinned copy, prefetch hits and misses per step, on CUDA the allocator segments created per measured
step, and the device buffer pool's size and its allocations per measured step (0: every weight copy reused a
buffer). On the CPU "host-to-device" is a host memory copy and nothing overlaps; the figures check the mechanism,
not the speed-up.

``--model toy``: the seeds' ToyModel in plain, offload and optimizer_offload modes (its first ``--frozen_layers``
layers frozen), as before.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "offload_training"))
from toy_model import ToyModel, train  # noqa: E402

from diffsynth.core import OffloadTrainingManager  # noqa: E402
from diffsynth.core.device import allocate_host_bytes, peak_memory_bytes, reset_peak_memory, resolve_device, synchronize  # noqa: E402  # noqa: E402

LORA_TARGETS = ["to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out",
                "img_mlp.net.2", "img_mod.1", "txt_mlp.net.2", "txt_mod.1"]
WARMUP_STEPS = 2
"""Not measured: the first pass records the order, the second is the first to prefetch."""


def build_qwen_image(num_blocks: int, dtype: torch.dtype, checkpointing: bool) -> torch.nn.Module:
    """A frozen Qwen-Image-shaped transformer (random weights) with a rank-16 LoRA, on the CPU."""
    from diffusers import QwenImageTransformer2DModel
    from peft import LoraConfig

    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = QwenImageTransformer2DModel(patch_size=2, in_channels=64, out_channels=16, num_layers=num_blocks,
                                            attention_head_dim=128, num_attention_heads=24, joint_attention_dim=3584,
                                            guidance_embeds=False, axes_dims_rope=(16, 56, 56))
    finally:
        torch.set_default_dtype(default)
    model.requires_grad_(False)
    model.add_adapter(LoraConfig(r=16, lora_alpha=16, target_modules=LORA_TARGETS, init_lora_weights="gaussian"))
    if checkpointing:
        model.enable_gradient_checkpointing()
    return model


def qwen_image_inputs(image_tokens: int, text_tokens: int, dtype: torch.dtype, device: torch.device) -> dict:
    """One sample: ``image_tokens`` latent patches (4096 for a 1024x1024 image) and a prompt of ``text_tokens``."""
    side = int(image_tokens ** 0.5)
    if side * side != image_tokens:
        raise ValueError(f"--image_tokens={image_tokens} must be a square number (64 x 64 = 4096 for 1024x1024)")
    generator = torch.Generator().manual_seed(1)
    return dict(hidden_states=torch.randn(1, image_tokens, 64, generator=generator, dtype=dtype).to(device),
                encoder_hidden_states=torch.randn(1, text_tokens, 3584, generator=generator, dtype=dtype).to(device),
                encoder_hidden_states_mask=torch.ones(1, text_tokens, device=device),
                timestep=torch.tensor([0.5], device=device), img_shapes=[[(1, side, side)]], return_dict=False)


def measure_peak_h2d(device: torch.device, nbytes: int = 1 << 29, repeats: int = 5) -> float:
    """The copy engine's peak host-to-device rate in bytes/s: the best of a few copies of one large pinned buffer."""
    host = allocate_host_bytes(nbytes, pinned=True)
    host.fill_(1)
    target = torch.empty(nbytes, dtype=torch.uint8, device=device)
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        target.copy_(host, non_blocking=True)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return nbytes / best


def moved_bytes(manager: OffloadTrainingManager | None) -> int:
    """Bytes of weights and buffers the manager has copied to the device so far."""
    if manager is None:
        return 0
    return sum(o.nbytes * o.load_count for o in manager._offloaders.values() if o.counts_toward_residency)


def lora_step(model: torch.nn.Module, inputs: dict, optimizer: torch.optim.Optimizer,
              manager: OffloadTrainingManager | None) -> float:
    """One optimizer step on a regression loss of the model's output; returns the loss."""
    loss = model(**inputs)[0].float().square().mean()
    loss.backward()
    if manager is not None:
        manager.after_backward()  # before the optimizer step, as always with the manager
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def run_mode(model: torch.nn.Module, inputs: dict, device: torch.device, steps: int, depth: int | None,
             reuse_device_buffers: bool = True) -> dict:
    """Trains the LoRA for ``steps`` steps, plain (``depth`` None) or offloaded with prefetch depth ``depth``."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    initial = [p.detach().clone() for p in trainable]
    manager = None
    if depth is None:
        model.to(device)
    else:
        manager = OffloadTrainingManager(model, device, prefetch_depth=depth,
                                         reuse_device_buffers=reuse_device_buffers)
    optimizer = torch.optim.AdamW(trainable, lr=1e-4)
    times, losses = [], []
    for step in range(WARMUP_STEPS + steps):
        if step == WARMUP_STEPS:
            reset_peak_memory(device)
            if manager is not None:
                manager.reset_peak_resident_bytes()
            moved_before = moved_bytes(manager)
            hits_before = manager.prefetch_stats.hits if manager is not None and manager.prefetch_stats else 0
            misses_before = manager.prefetch_stats.misses if manager is not None and manager.prefetch_stats else 0
            segments_before = _segments(device)
            pool_allocations_before = _pool_allocations(manager)
        synchronize(device)
        start = time.perf_counter()
        losses.append(lora_step(model, inputs, optimizer, manager))
        synchronize(device)
        times.append(time.perf_counter() - start)
    stats = manager.prefetch_stats if manager is not None else None
    result = dict(step=statistics.median(times[WARMUP_STEPS:]), losses=losses,
                  peak_cuda=peak_memory_bytes(device),
                  peak_weights=manager.peak_resident_bytes if manager is not None else None,
                  moved=(moved_bytes(manager) - moved_before) / steps,
                  hits=(stats.hits - hits_before) / steps if stats else None,
                  misses=(stats.misses - misses_before) / steps if stats else None,
                  segments=(_segments(device) - segments_before) / steps if device.type == "cuda" else None,
                  pool_reserved=_pool_reserved(manager),
                  pool_allocations=(_pool_allocations(manager) - pool_allocations_before) / steps)
    if manager is not None:
        manager.remove()
    else:
        model.to("cpu")
    with torch.no_grad():
        for param, value in zip(trainable, initial):
            param.copy_(value)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def _pool_reserved(manager: OffloadTrainingManager | None) -> int | None:
    stats = manager.device_pool_stats if manager is not None else None
    return stats.reserved_bytes if stats is not None else None


def _pool_allocations(manager: OffloadTrainingManager | None) -> int:
    stats = manager.device_pool_stats if manager is not None else None
    return stats.allocations if stats is not None else 0


def _segments(device: torch.device) -> int:
    return torch.cuda.memory_stats(device).get("segment.all.allocated", 0) if device.type == "cuda" else 0


def bench_qwen_image(args: argparse.Namespace, device: torch.device) -> None:
    on_gpu = device.type == "cuda"
    num_blocks = args.num_blocks or (16 if on_gpu else 1)
    image_tokens = args.image_tokens or (4096 if on_gpu else 256)
    text_tokens = args.text_tokens or (256 if on_gpu else 32)
    steps = args.steps or (6 if on_gpu else 3)
    dtype = torch.bfloat16
    depths = [int(d) for d in args.prefetch_depths.split(",")]
    model = build_qwen_image(num_blocks, dtype, not args.no_gradient_checkpointing)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    inputs = qwen_image_inputs(image_tokens, text_tokens, dtype, device)
    peak_rate = measure_peak_h2d(device)
    modes = {f"offload K={k}": (k, True) for k in [0, *depths]}
    modes[f"K={depths[-1]} no pool"] = (depths[-1], False)
    results = {name: run_mode(model, inputs, device, steps, k, pool) for name, (k, pool) in modes.items()}
    results["plain"] = run_mode(model, inputs, device, steps, None)

    print(f"Qwen-Image-shaped DiT: {num_blocks} block(s), {weight_bytes / 2**30:.2f} GiB of {dtype} weights, "
          f"{image_tokens} image + {text_tokens} text tokens, LoRA r16, gradient checkpointing "
          f"{'off' if args.no_gradient_checkpointing else 'on'}, on {device}; median of {steps} steps after "
          f"{WARMUP_STEPS} warm-up")
    source = "pinned host buffer" if on_gpu else "host buffer (no pinned memory on the CPU)"
    print(f"copy engine peak (one {2**29 // 2**20} MiB copy from a {source}): {peak_rate / 1e9:.1f} GB/s")
    memory = "peak CUDA" if on_gpu else "peak weights"
    print(f"{'mode':>12} | {'step':>9} | {'vs plain':>8} | {memory:>10} | {'moved/step':>10} | {'achieved':>9} | "
          f"{'of peak':>7} | {'hits/step':>9} | {'misses/step':>11} | {'new segments/step':>17} | "
          f"{'device pool':>11} | {'pool allocs/step':>16}")
    plain = results["plain"]["step"]
    for name in ["plain", *modes]:
        r = results[name]
        rate = r["moved"] / r["step"]
        peak = r["peak_cuda"] if on_gpu else (r["peak_weights"] if r["peak_weights"] is not None else weight_bytes)
        hits = "-" if r["hits"] is None else f"{r['hits']:.1f}"
        misses = "-" if r["misses"] is None else f"{r['misses']:.1f}"
        segments = "-" if r["segments"] is None else f"{r['segments']:.1f}"
        pool = "-" if r["pool_reserved"] is None else f"{r['pool_reserved'] / 2**30:.2f} GiB"
        pool_allocations = "-" if r["pool_reserved"] is None else f"{r['pool_allocations']:.1f}"
        print(f"{name:>12} | {r['step'] * 1e3:6.0f} ms | {r['step'] / plain:7.2f}x | {peak / 2**30:6.2f} GiB | "
              f"{r['moved'] / 2**30:6.2f} GiB | {rate / 1e9:5.1f} GB/s | {rate / peak_rate:6.0%} | {hits:>9} | "
              f"{misses:>11} | {segments:>17} | {pool:>11} | {pool_allocations:>16}")
    final = {name: r["losses"][-1] for name, r in results.items()}
    print("final losses:", ", ".join(f"{name} {loss:.6f}" for name, loss in final.items()))


def bench_toy(args: argparse.Namespace, device: torch.device) -> None:
    dim = args.dim or (4096 if device.type == "cuda" else 512)
    batch = args.batch or (512 if device.type == "cuda" else 128)
    steps = args.steps or 12
    results = {}
    for mode in ("plain", "offload", "optimizer_offload"):
        torch.manual_seed(0)
        model = ToyModel(dim, args.num_layers)
        model.layers[: args.frozen_layers].requires_grad_(False)
        results[mode] = train(model, device, steps, batch, mode, progress=False)

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", choices=["qwen-image", "toy"], default="qwen-image")
    parser.add_argument("--steps", type=int, help="measured steps (default: qwen-image 6 on CUDA, 3 on the CPU, "
                                                  "after 2 warm-up; toy 12, the first two warm-up)")
    group = parser.add_argument_group("qwen-image")
    group.add_argument("--num_blocks", type=int, help="transformer blocks (default: 16 on CUDA, 1 on the CPU)")
    group.add_argument("--image_tokens", type=int, help="a square number (default: 4096 = 1024x1024 on CUDA, 256 on "
                                                        "the CPU)")
    group.add_argument("--text_tokens", type=int, help="prompt tokens (default: 256 on CUDA, 32 on the CPU)")
    group.add_argument("--prefetch_depths", default="1,2", help="comma-separated prefetch depths to measure")
    group.add_argument("--no_gradient_checkpointing", action="store_true")
    group = parser.add_argument_group("toy")
    group.add_argument("--dim", type=int, help="layer width (default: 4096 on CUDA, 512 on the CPU)")
    group.add_argument("--num_layers", type=int, default=10)
    group.add_argument("--frozen_layers", type=int, default=5, help="how many leading layers are frozen")
    group.add_argument("--batch", type=int, help="rows per step (default: 512 on CUDA, 128 on the CPU)")
    args = parser.parse_args()
    device = resolve_device(args.device, "--device")
    if args.model == "toy":
        bench_toy(args, device)
    else:
        bench_qwen_image(args, device)


if __name__ == "__main__":
    main()
