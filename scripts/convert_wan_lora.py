"""Rewrites a Wan LoRA saved by the trainer (diffusers keys) in the original Wan code's key naming.

Usage: python scripts/convert_wan_lora.py models/train/Wan_lora/epoch-4.safetensors epoch-4.original.safetensors
"""

import argparse

from safetensors import safe_open
from safetensors.torch import load_file

from diffsynth.core.files import atomic_save_safetensors
from diffsynth.pipelines.wan_video import lora_to_original_wan


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input", help="LoRA .safetensors written by the trainer")
    parser.add_argument("output", help="where to write the renamed LoRA")
    args = parser.parse_args(argv)
    with safe_open(args.input, framework="pt") as handle:
        metadata = handle.metadata() or {}
    # Both entries name diffusers modules, so they would mislead a loader of the original naming.
    metadata.pop("lora_adapter_metadata", None)
    metadata.pop("lora_target_modules", None)
    atomic_save_safetensors(lora_to_original_wan(load_file(args.input)), args.output, metadata)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
