"""Peak host memory of writing a full checkpoint: the block-by-block writer against ``save_pretrained``.

Builds a Qwen-Image transformer of a few hundred MB (random float32 weights, as training holds them), then, in a
fresh process per mode, writes it and prints how far the process's peak resident memory rose above what the model
itself takes: ``write_full_model`` (the diffusers folder in bfloat16, converted and written one block at a time),
``flat_file`` (the logger's flat ``<name>.safetensors`` in bfloat16, cast as one state dict) and ``save_pretrained``
(diffusers' own writer, float32).

    python scripts/bench_full_checkpoint_memory.py [--layers 8] [--width 512]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

MODES = ("write_full_model", "flat_file", "save_pretrained")


def build(layers: int, width: int):
    import torch
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(0)
    heads = width // 64
    return QwenImageTransformer2DModel(patch_size=2, in_channels=64, out_channels=16, num_layers=layers,
                                       attention_head_dim=64, num_attention_heads=heads, joint_attention_dim=64,
                                       guidance_embeds=False, axes_dims_rope=(16, 24, 24))


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def worker(mode: str, layers: int, width: int, folder: Path) -> None:
    import torch

    model = build(layers, width)
    model_mib = sum(t.numel() * t.element_size() for t in model.state_dict().values()) / 2**20
    block_mib = sum(p.numel() * 2 for p in model.transformer_blocks[0].parameters()) / 2**20  # in bfloat16
    before = peak_mib()
    if mode == "write_full_model":
        from diffsynth.training.outputs.full_model import write_full_model

        write_full_model(model, folder, "bench", "dit", ["diffusers"], dtype=torch.bfloat16)
    elif mode == "flat_file":
        from diffsynth.training.outputs.logger import ModelLogger

        ModelLogger(folder, remove_prefix_in_ckpt="", save_dtype="bfloat16").save_state_dict(model.state_dict(),
                                                                                             "bench")
    else:
        model.save_pretrained(folder / "bench.dit")
    print(f"{mode:>17}: model {model_mib:7.1f} MiB (float32), one block {block_mib:6.1f} MiB (bfloat16), peak rose "
          f"{peak_mib() - before:7.1f} MiB while writing")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.layers, args.width, args.folder)
        return 0
    for mode in MODES:  # a fresh process each: the peak resident size only ever grows
        with tempfile.TemporaryDirectory() as folder:
            subprocess.run([sys.executable, __file__, "--worker", mode, "--folder", folder, "--layers",
                            str(args.layers), "--width", str(args.width)], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
