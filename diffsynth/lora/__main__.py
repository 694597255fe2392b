"""``python -m diffsynth.lora``: inspect a LoRA file, or convert it to another layout.

    python -m diffsynth.lora inspect models/train/lora/epoch-4.safetensors [--model FOLDER] [--json]
    python -m diffsynth.lora convert IN.safetensors OUT.safetensors --to kohya [--model FOLDER]

``inspect`` exits with 0 when diffsynth, diffusers, ComfyUI and DiffSynth-Studio all load every layer at the trained
strength, 1 otherwise, 2 on bad arguments or an unreadable file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from ..core.library_notices import quiet_library_notices
from ..core.unused_libraries import keep_out
from .base_layers import LAYERS_KEY, BaseLayers
from .formats import LAYOUTS, MODEL_CLASS_KEY, MODEL_CONFIG_KEY, write_lora
from .inspect import base_layers_from_metadata, inspect_lora, skeleton_from_folder
from .naming import naming_for
from .reading import read_file, read_lora

# Entries that describe the base model and the run; a converted file keeps them.
_KEPT = (MODEL_CLASS_KEY, MODEL_CONFIG_KEY, LAYERS_KEY, "lora_base_model", "lora_target_modules",
         "diffsynth_version", "step", "epoch")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m diffsynth.lora", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser("inspect", help="what a LoRA file is, and how much of it each tool loads")
    inspect.add_argument("file", help="the LoRA .safetensors file")
    inspect.add_argument("--model", default=None,
                         help="the base model's folder (with config.json, or a repository with transformer/); unset "
                              "uses the model the file's metadata records (files written by this trainer)")
    inspect.add_argument("--json", action="store_true", help="print the findings as JSON")
    convert = commands.add_parser("convert", help="rewrite a LoRA file in another layout")
    convert.add_argument("input", help="the LoRA .safetensors file to read (any layout)")
    convert.add_argument("output", help="where to write the converted file")
    convert.add_argument("--to", required=True, choices=LAYOUTS,
                         help="universal: ComfyUI, DiffSynth-Studio and diffusers; diffusers: the transformer.-keyed "
                              "peft layout; kohya: lora_unet_* with .alpha (musubi-tuner's own); peft: the "
                              "reference's *.lora_A.default.weight")
    convert.add_argument("--model", default=None, help="as for inspect; needed to read kohya files not written here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        keep_out("bitsandbytes")  # no quantized layer is built or loaded here
    args = build_parser().parse_args(argv)
    quiet_library_notices()
    try:
        if args.command == "inspect":
            inspection = inspect_lora(args.file, args.model)
            print(json.dumps(inspection.as_dict(), indent=2, default=str) if args.json else inspection.format())
            failing = inspection.failing()
            if failing and not args.json:
                print(f"\nnot loaded fully at the trained strength by: {', '.join(r.tool for r in failing)}")
            return 1 if failing else 0
        return _convert(args.input, args.output, args.to, args.model)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _convert(source: str, target: str, layout: str, model: str | None) -> int:
    """Rewrites the LoRA file ``source`` as ``target`` in ``layout``; ``model`` is the base model's folder (None:
    the model the file's metadata records)."""
    _, metadata = read_file(source)
    base = BaseLayers.of(skeleton_from_folder(model)) if model else base_layers_from_metadata(metadata)
    module_names = list(base.shapes) if base is not None else None
    naming = naming_for(base.model_class if base is not None else metadata.get(MODEL_CLASS_KEY, ""))
    weights = read_lora(source, module_names, naming)
    kept = {key: metadata[key] for key in _KEPT if key in metadata}
    path = write_lora(Path(target), weights, layout, naming, kept)
    print(f"wrote {path} ({layout} layout, {len(weights.layers)} layers, from {weights.layout})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
