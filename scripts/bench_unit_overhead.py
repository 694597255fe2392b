"""Per-unit bookkeeping of offload training: plain training, a floor, the seeds' naive manager and ours, in one run.

    python scripts/bench_unit_overhead.py                              # 400 tiny leaves on the CPU
    python scripts/bench_unit_overhead.py --model qwen-image           # a small Qwen-Image-shaped stack, 256 tokens
    python scripts/bench_unit_overhead.py --device cuda --rounds 20

Every mode trains its own copy of the same model (frozen weights, something small that trains, AdamW), attached once;
the modes then take turns, one burst of ``--steps`` steps each per round, so a busy machine slows them alike. A step
is timed in thread CPU time (``time.thread_time_ns``, torch on one thread: the time this process's thread spent, not
what other processes took from it); on CUDA in wall time after a synchronisation, since the GPU's work is not the
host thread's. Reported per mode: the median step, its ratio to plain, and the bookkeeping per unit per step: (median
step - plain's) / units.

Modes:

- ``plain``: the model on the device, no hook.
- ``floor``: the least a hook manager must do. Each weight has its own preallocated device buffer (so nothing is freed:
  no memory saving), and a forward pre-hook copies the unit's weights into them before the forward, a hook on the
  unit's output again before its backward. Copies as many bytes as offloading does, with the least possible Python.
- ``seeds``: the seeds' naive manager, rewritten from its description: four module hooks per leaf (forward pre-hook:
  a fresh device copy of each master bound to the parameter; forward hook: the empty placeholder bound again; the same
  pair as full backward pre-hook and backward hook), and its ``_in_recompute`` rule for checkpointing (a recomputed
  leaf is not unloaded after its forward). The seeds' ``master.to(device)`` copies nothing when the device is the
  host; here it always copies, as ours does, so the modes move the same bytes.
- ``ours``: ``OffloadTrainingManager`` with its defaults on the device; ``ours pool`` / ``ours no pool`` force the
  device buffer pool on or off (``reuse_device_buffers``), the measurement behind the default.

Goal (issue 31): ours' bookkeeping per unit at most the seeds', and within 1.3x of the floor's.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings
from collections.abc import Callable

import torch
from torch import nn

from diffsynth.core import OffloadTrainingManager
from diffsynth.core.device import copy_into, copy_to_host, resolve_device, synchronize
from diffsynth.core.offload_training.hooks import inside_backward

WIDTH = 16


class TinyLeaves(nn.Module):
    """``leaves`` frozen tiny leaves (alternately ``Linear`` and ``LayerNorm``) after a trainable scale: every leaf
    runs a forward and a backward each step and computes almost nothing, so a step is mostly bookkeeping."""

    def __init__(self, leaves: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(WIDTH))
        self.layers = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) if i % 2 == 0 else nn.LayerNorm(WIDTH)
                                      for i in range(leaves)])
        self.layers.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x * self.scale)


def weighted_leaves(model: nn.Module) -> list[nn.Module]:
    """The leaf modules holding tensors: the units of the offload manager's default placement."""
    return [m for m in model.modules() if not list(m.children()) and (m._parameters or m._buffers)]


class FloorManager:
    """Copies each frozen weight of every leaf into its own preallocated device buffer before each use."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        model.to(device)
        self.handles = []
        # On the host ``copy_into`` is a plain ``copy_``: call that, so the floor pays no check it does not need.
        copy = torch.Tensor.copy_ if device.type == "cpu" else copy_into
        for leaf in weighted_leaves(model):
            # Host masters (pinned on CUDA), copied into the parameter's own device tensor.
            pairs = [(copy_to_host(p.data), p.data) for p in leaf.parameters(recurse=False) if not p.requires_grad]
            if not pairs:
                continue

            def copy_in(*_: object, pairs: list = pairs) -> None:
                for master, buffer in pairs:
                    copy(buffer, master)

            def before_backward(module: nn.Module, args: tuple, output: torch.Tensor, copy_in: Callable = copy_in) -> None:
                if output.requires_grad:
                    output.register_hook(copy_in)

            self.handles.append(leaf.register_forward_pre_hook(copy_in))
            self.handles.append(leaf.register_forward_hook(before_backward))

    def after_backward(self) -> None:
        """Nothing to do: no weight was ever freed."""


class SeedsManager:
    """The seeds' naive per-leaf manager (see the module docstring), in this benchmark's words."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.device = device
        self.in_recompute: set[int] = set()
        self.handles = []
        for param in model.parameters():
            if param.requires_grad:
                param.data = param.data.to(device)
        for leaf in weighted_leaves(model):  # every leaf, as the seeds' manager hooks a LoRA's layers too
            frozen = [p for p in leaf.parameters(recurse=False) if not p.requires_grad]
            masters = [copy_to_host(p.data) for p in frozen]  # pinned on CUDA, as the seeds' arena
            placeholder = torch.empty(0, device=device)
            for param in frozen:
                param.data = placeholder

            def onload(*_: object, frozen: list = frozen, masters: list = masters) -> None:
                for param, master in zip(frozen, masters):
                    param.data = master.to(device, copy=True, non_blocking=True)

            def offload(*_: object, frozen: list = frozen, placeholder: torch.Tensor = placeholder) -> None:
                for param in frozen:
                    param.data = placeholder

            def after_forward(module: nn.Module, *_: object, offload: Callable = offload) -> None:
                if id(module) in self.in_recompute and inside_backward():
                    return  # a recompute: the leaf's backward comes next and needs the weights
                self.in_recompute.add(id(module))
                offload()

            self.handles += [leaf.register_forward_pre_hook(onload), leaf.register_forward_hook(after_forward),
                             leaf.register_full_backward_pre_hook(onload), leaf.register_full_backward_hook(offload)]
        # torch warns each step that a full backward hook of a leaf whose inputs need no gradient fires on outputs.
        warnings.filterwarnings("ignore", message="Full backward hook is firing")

    def after_backward(self) -> None:
        self.in_recompute.clear()


def build_leaves(args: argparse.Namespace) -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    torch.manual_seed(0)
    model = TinyLeaves(args.leaves)
    x = torch.randn(4, WIDTH)

    def loss_of(m: nn.Module) -> torch.Tensor:
        return m(x.to(args.device)).square().mean()

    return model, loss_of


def build_qwen_image(args: argparse.Namespace) -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    """diffusers' ``QwenImageTransformer2DModel``, narrow (``--heads`` heads of 32), float32, a rank-4 LoRA on the
    trainer's targets, gradient checkpointing on: the real leaf structure of a Qwen-Image block at a CPU's size."""
    from diffusers import QwenImageTransformer2DModel
    from peft import LoraConfig

    torch.manual_seed(0)
    model = QwenImageTransformer2DModel(patch_size=2, in_channels=64, out_channels=16, num_layers=args.num_blocks,
                                        attention_head_dim=32, num_attention_heads=args.heads,
                                        joint_attention_dim=64, guidance_embeds=False, axes_dims_rope=(8, 12, 12))
    model.requires_grad_(False)
    targets = ["to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out",
               "img_mlp.net.2", "img_mod.1", "txt_mlp.net.2", "txt_mod.1"]
    model.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=targets, init_lora_weights="gaussian"))
    model.enable_gradient_checkpointing()
    side = int(args.image_tokens ** 0.5)
    generator = torch.Generator().manual_seed(1)
    inputs = {"hidden_states": torch.randn(1, side * side, 64, generator=generator),
              "encoder_hidden_states": torch.randn(1, 32, 64, generator=generator),
              "encoder_hidden_states_mask": torch.ones(1, 32), "timestep": torch.tensor([0.5]),
              "img_shapes": [[(1, side, side)]], "return_dict": False}

    def loss_of(m: nn.Module) -> torch.Tensor:
        on_device = {k: v.to(args.device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        return m(**on_device)[0].square().mean()

    return model, loss_of


class Mode:
    """One way of training: its own copy of the model, its manager and optimizer, and its step times."""

    def __init__(self, name: str, model: nn.Module, manager: object | None, loss_of: Callable) -> None:
        self.name, self.model, self.manager, self.loss_of = name, model, manager, loss_of
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        self.times: list[float] = []
        self.last_loss = float("nan")

    def step(self) -> None:
        loss = self.loss_of(self.model)
        loss.backward()
        if self.manager is not None:
            self.manager.after_backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.last_loss = loss.detach()


def make_modes(args: argparse.Namespace, device: torch.device) -> list[Mode]:
    model, loss_of = (build_leaves if args.model == "leaves" else build_qwen_image)(args)
    managers: dict[str, Callable[[nn.Module], object | None]] = {
        "plain": lambda m: m.to(device) and None,
        "floor": lambda m: FloorManager(m, device),
        "seeds": lambda m: SeedsManager(m, device),
        "ours": lambda m: OffloadTrainingManager(m, device),
        "ours pool": lambda m: OffloadTrainingManager(m, device, reuse_device_buffers=True),
        "ours no pool": lambda m: OffloadTrainingManager(m, device, reuse_device_buffers=False),
    }
    modes = []
    for name in args.modes.split(","):
        if name not in managers:
            raise SystemExit(f"--modes: unknown mode {name!r}; choose from {', '.join(managers)}")
        copied = copy.deepcopy(model)
        modes.append(Mode(name, copied, managers[name](copied), loss_of))
    return modes


def timed_burst(mode: Mode, steps: int, device: torch.device) -> None:
    on_gpu = device.type == "cuda"
    for _ in range(steps):
        if on_gpu:
            synchronize(device)
            start = time.perf_counter_ns()
        else:
            start = time.thread_time_ns()
        mode.step()
        if on_gpu:
            synchronize(device)
            mode.times.append((time.perf_counter_ns() - start) / 1e9)
        else:
            mode.times.append((time.thread_time_ns() - start) / 1e9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", choices=["leaves", "qwen-image"], default="leaves")
    parser.add_argument("--leaves", type=int, default=400, help="tiny leaves (--model leaves)")
    parser.add_argument("--num_blocks", type=int, default=2, help="transformer blocks (--model qwen-image)")
    parser.add_argument("--heads", type=int, default=8, help="attention heads of 32 (--model qwen-image)")
    parser.add_argument("--image_tokens", type=int, default=256, help="a square number (--model qwen-image)")
    parser.add_argument("--rounds", type=int, default=15, help="rounds; each mode runs one burst per round")
    parser.add_argument("--steps", type=int, default=5, help="steps per burst")
    parser.add_argument("--warmup", type=int, default=3, help="steps per mode before timing (the first passes "
                                                              "record the order and fill the pool)")
    parser.add_argument("--modes", default="plain,floor,seeds,ours,ours pool,ours no pool",
                        help="comma-separated modes to run, of: plain, floor, seeds, ours, ours pool, ours no pool")
    args = parser.parse_args()
    args.device = device = resolve_device(args.device, "--device")
    torch.set_num_threads(1)
    modes = make_modes(args, device)
    units = len(weighted_leaves(modes[0].model))
    for mode in modes:
        for _ in range(args.warmup):
            mode.step()
    for _ in range(args.rounds):
        for mode in modes:
            timed_burst(mode, args.steps, device)

    clock = "wall time" if device.type == "cuda" else "thread CPU time, 1 torch thread"
    what = (f"{args.leaves} tiny leaves" if args.model == "leaves" else
            f"Qwen-Image-shaped DiT, {args.num_blocks} block(s) of {args.heads}x32, {args.image_tokens} image "
            "tokens, LoRA r4, checkpointing")
    print(f"{what}: {units} leaves with tensors on {device}; median of {args.rounds} x {args.steps} steps ({clock}), "
          f"{args.warmup} warm-up")
    medians = {mode.name: statistics.median(mode.times) for mode in modes}
    plain = medians.get("plain")
    floor = medians.get("floor")
    print(f"{'mode':>13} | {'step':>10} | {'vs plain':>8} | {'per unit':>9} | {'vs floor':>8} | final loss")
    for mode in modes:
        step = medians[mode.name]
        ratio = f"{step / plain:7.2f}x" if plain else "-"
        per_unit = (step - plain) / units if plain is not None else None
        per_unit_text = f"{per_unit * 1e6:6.1f} us" if per_unit is not None else "-"
        floor_unit = (floor - plain) / units if plain is not None and floor is not None else None
        vs_floor = f"{per_unit / floor_unit:7.2f}x" if floor_unit and per_unit and mode.name != "plain" else "-"
        print(f"{mode.name:>13} | {step * 1e3:7.2f} ms | {ratio:>8} | {per_unit_text:>9} | {vs_floor:>8} | "
              f"{float(mode.last_loss):.6f}")


if __name__ == "__main__":
    main()
