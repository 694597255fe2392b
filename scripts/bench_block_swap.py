"""Step time and memory of block swap (classic and H2D-only) against plain LoRA training, measured in one run.

    python scripts/bench_block_swap.py --threads 1             # CPU: a small Wan transformer, sync engine
    python scripts/bench_block_swap.py --device cuda --dim 1536 --num_layers 30   # about Wan2.1-1.3B's blocks

The model is a diffusers ``WanTransformer3DModel`` with random weights (``--dim`` wide, ``--num_layers`` blocks), a
peft LoRA on the attention projections, gradient checkpointing on in every mode, AdamW. Each mode trains the same
steps from the same weights; the first two steps are warm-up. Memory is the peak allocated CUDA memory on a GPU; on
the CPU (where "device" and host are the same memory) it is the block weight bytes that would sit on the device:
everything for plain training, the resident blocks plus the peak of swapped blocks or the ring for block swap.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from diffusers import WanTransformer3DModel
from peft import LoraConfig, inject_adapter_in_model

from diffsynth.core.device import peak_memory_bytes, reset_peak_memory, resolve_device, synchronize
from diffsynth.core.offload_training import BlockSwapConfig, create_offloader

MB = 2**20


def build(args: argparse.Namespace) -> tuple[WanTransformer3DModel, dict]:
    torch.manual_seed(0)
    heads = max(1, args.dim // 64)
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=heads, attention_head_dim=args.dim // heads,
                                  in_channels=16, out_channels=16, text_dim=64, freq_dim=64, ffn_dim=4 * args.dim,
                                  num_layers=args.num_layers, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                                  rope_max_seq_len=64)
    model.requires_grad_(False)
    inject_adapter_in_model(LoraConfig(r=16, lora_alpha=16, target_modules=["to_q", "to_k", "to_v", "to_out.0"]),
                            model)
    model.enable_gradient_checkpointing()
    side = args.latent_size
    inputs = dict(hidden_states=torch.randn(1, 16, args.frames, side, side),
                  encoder_hidden_states=torch.randn(1, 16, 64), timestep=torch.tensor([500]), return_dict=False)
    return model, inputs


class Trainer:
    """One mode's model, offloader and optimizer; ``step()`` trains one step and records its time and loss."""

    def __init__(self, model: torch.nn.Module, inputs: dict, device: torch.device,
                 config: BlockSwapConfig | None) -> None:
        self.model, self.device = model, device
        self.offloader = None if config is None else create_offloader(model, config, device)
        if config is None:
            model.to(device)
        self.inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        self.times: list[float] = []
        self.losses: list[float] = []

    def step(self, seed: int) -> None:
        synchronize(self.device)
        start = time.perf_counter()
        torch.manual_seed(seed)
        output = self.model(**self.inputs)[0]
        loss = (output - torch.randn_like(output)).square().mean()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        synchronize(self.device)
        self.times.append(time.perf_counter() - start)
        self.losses.append(loss.item())

    def weight_bytes_on_device(self) -> tuple[int, int]:
        """(all block weight bytes, block weight bytes on the device at the peak)."""
        total = sum(p.numel() * p.element_size() for n, p in self.model.named_parameters()
                    if n.startswith("blocks.") and "lora_" not in n)
        if self.offloader is None:
            return total, total
        return total, total - self.offloader.offloaded_bytes + self.offloader.peak_swapped_bytes


def measure(trainers: dict[str, Trainer], device: torch.device, steps: int) -> dict[str, int | None]:
    """Steps the modes in turn (so a busy machine slows them alike); the peak CUDA memory of each mode alone."""
    peaks = {}
    for name, trainer in trainers.items():
        reset_peak_memory(device)
        trainer.step(0)
        peaks[name] = peak_memory_bytes(device)
    for seed in range(1, steps):
        for trainer in trainers.values():
            trainer.step(seed)
    return peaks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dim", type=int, default=256, help="hidden width of the transformer")
    parser.add_argument("--num_layers", type=int, default=8, help="number of blocks")
    parser.add_argument("--latent_size", type=int, default=16, help="latent height and width (tokens: size^2/4*frames)")
    parser.add_argument("--frames", type=int, default=2, help="latent frames")
    parser.add_argument("--blocks_to_swap", type=int, default=4)
    parser.add_argument("--steps", type=int, default=7, help="steps per mode; the first two are warm-up")
    parser.add_argument("--pinned", action="store_true",
                        help="--use_pinned_memory_for_block_swap (on CUDA: the direct engine)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (CPU); 1 gives steady figures on a busy machine")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device, "--device")
    swap = args.blocks_to_swap
    modes = {
        "plain": None,
        f"classic S={swap}": BlockSwapConfig(swap, use_pinned_memory=args.pinned),
        f"h2d S={swap} ring=1": BlockSwapConfig(swap, h2d_only=True, ring_size=1, use_pinned_memory=args.pinned),
        f"h2d S={swap} ring=2": BlockSwapConfig(swap, h2d_only=True, ring_size=2, use_pinned_memory=args.pinned),
    }
    base, inputs = build(args)
    if device.type == "cuda":
        # Each mode is measured alone on a GPU, so its peak memory is its own.
        trainers, peaks = {}, {}
        for name, config in modes.items():
            trainer = Trainer(copy.deepcopy(base), inputs, device, config)
            peaks.update(measure({name: trainer}, device, args.steps))
            if trainer.offloader is not None:
                trainer.offloader.remove()
            trainer.model.to("cpu")
            trainers[name] = trainer
    else:
        trainers = {name: Trainer(copy.deepcopy(base), inputs, device, config) for name, config in modes.items()}
        peaks = measure(trainers, device, args.steps)
    plain = statistics.median(trainers["plain"].times[2:])
    total, _ = trainers["plain"].weight_bytes_on_device()
    tokens = args.frames * args.latent_size**2 // 4
    print(f"WanTransformer3DModel dim={args.dim} blocks={args.num_layers} tokens={tokens} on {device}; "
          f"block weights {total / MB:.1f} MiB; median of {args.steps - 2} steps")
    memory_kind = "peak CUDA MiB" if device.type == "cuda" else "block weights on device MiB"
    print(f"{'mode':>18} | {'step ms':>9} | {'vs plain':>8} | {memory_kind:>27} | {'last loss':>10}")
    for name, trainer in trainers.items():
        step = statistics.median(trainer.times[2:])
        memory = peaks[name] if device.type == "cuda" else trainer.weight_bytes_on_device()[1]
        print(f"{name:>18} | {step * 1e3:9.1f} | {step / plain:7.2f}x | {memory / MB:27.1f} | "
              f"{trainer.losses[-1]:10.6f}")


if __name__ == "__main__":
    main()
