"""The flags every ``validate_lora`` / ``validate_full`` script shares, and their checks.

A validate script renders one sample with a trained LoRA merged into the model (or a full fine-tune's weights loaded
over the released ones). Loading the model takes minutes, so everything the flags can get wrong is found here, before
any model loads, and reported by the parser (the flag, the value and the fix). What a script renders with (edit
images, a control clip...) it declares as ``InputFlag`` values; the checked flags come back as one frozen
``Rendering``, which the script's steps (``diffsynth.training.validate``) read instead of the argparse Namespace.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .model import TORCH_DTYPES

# Kinds whose value names files (``images``: one or more); the others are a number, a word, a folder or a switch.
FILE_KINDS = ("image", "images", "video")
VALUE_TYPES = {"number": float, "integer": int, "text": str}


@dataclass(frozen=True)
class InputFlag:
    """A flag naming what a script renders with, beside the prompt.

    Attributes:
        kind: ``image`` / ``video`` (a file), ``images`` (one or more files), ``folder``, ``number``, ``integer``,
            ``text`` or ``switch`` (on when given).
        help: What to pass, for ``--help`` and the errors.
        required: The release renders nothing without it.
        default: Its value when not given.
    """

    kind: str
    help: str
    required: bool = False
    default: Any = None


@dataclass(frozen=True)
class Weights:
    """A flag naming a trained file, the pipeline slots it applies to, its default and its help."""

    flag: str
    slots: tuple[str, ...]
    default: str
    help: str


@dataclass(frozen=True)
class Defaults:
    """A script's defaults of the shared flags (the reference script's values where it has them)."""

    prompt: str
    models: str
    output: str
    negative_prompt: str = ""
    cfg_scale: float | None = None
    height: int | None = None
    width: int | None = None
    steps: int | None = None
    seed: int = 0
    tokenizer: str | None = None


@dataclass(frozen=True)
class Rendering:
    """The checked flags of one validate run.

    Attributes:
        weights: ``(flag, slots, path)`` of each trained file; an empty path leaves its slots as released.
        full: Whether the files are full fine-tunes (loaded over the weights) rather than LoRAs (merged).
        strength: The LoRA's strength on top of its own alpha / rank (0 renders the base model).
        inputs: The script's ``InputFlag`` values by name (None where not given).
        call: The shared sampling arguments of the pipeline's call, those left unset omitted (the pipeline's
            defaults then apply).
        before_after: Where to write the render without and with the trained weights, side by side; None: not.
    """

    weights: tuple[tuple[str, tuple[str, ...], str], ...]
    full: bool
    strength: float
    output: Path
    device: str
    torch_dtype: str
    models: str
    tokenizer: str | None
    inputs: Mapping[str, Any] = field(default_factory=dict)
    call: Mapping[str, Any] = field(default_factory=dict)
    before_after: str | None = None
    caption: str = ""


def add_flags(parser: argparse.ArgumentParser, weights: Sequence[Weights], full: bool, defaults: Defaults,
              inputs: Mapping[str, InputFlag], output_help: str, compare: bool = True) -> None:
    """Adds the trained files' flags, ``inputs`` and the shared sampling flags to ``parser``; ``compare`` adds
    ``--before_after`` (an image script's)."""
    import torch  # the device default only; the flags parse without a model

    for entry in weights:
        parser.add_argument(entry.flag, default=entry.default, help=entry.help)
    if not full:
        parser.add_argument("--lora_alpha_scale", type=float, default=1.0,
                            help="multiplies the LoRA's own alpha / rank scale; 0 renders the base model")
    parser.add_argument("--prompt", default=defaults.prompt, help="what to render")
    parser.add_argument("--negative_prompt", default=defaults.negative_prompt,
                        help="what to steer away from (with --cfg_scale other than 1)")
    for name, entry in inputs.items():
        needed = " (required)" if entry.required else ""
        if entry.kind == "images":
            parser.add_argument(f"--{name}", nargs="+", action="extend", default=entry.default,
                                help=entry.help + needed)
        elif entry.kind == "switch":
            parser.add_argument(f"--{name}", action="store_true", default=bool(entry.default), help=entry.help)
        else:
            parser.add_argument(f"--{name}", type=VALUE_TYPES.get(entry.kind, str), default=entry.default,
                                help=entry.help + needed)
    parser.add_argument("--cfg_scale", type=float, default=defaults.cfg_scale,
                        help="classifier-free guidance; 1 turns it off (unset: the pipeline's default)")
    parser.add_argument("--output", default=defaults.output, help=output_help)
    if compare:
        parser.add_argument("--before_after", default=None,
                            help="also render without the trained weights (same prompt and seed, one model load) "
                                 "and write both, side by side with their difference, to this image file")
        parser.add_argument("--caption", default="", help="text under the --before_after picture")
    parser.add_argument("--height", type=int, default=defaults.height,
                        help="height in pixels, rounded to the model's multiple (unset: the pipeline's default)")
    parser.add_argument("--width", type=int, default=defaults.width,
                        help="width in pixels, rounded to the model's multiple (unset: the pipeline's default)")
    parser.add_argument("--steps", type=int, default=defaults.steps,
                        help="denoising steps (unset: the pipeline's default)")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="noise seed; the same seed renders the same")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="compute device (default: cuda when available, else cpu)")
    parser.add_argument("--torch_dtype", default="bfloat16", choices=TORCH_DTYPES,
                        help="dtype of the weights and the computation")
    parser.add_argument("--model_id_with_origin_paths", default=defaults.models,
                        help="comma list of model_id:file_pattern entries, as given to the trainer")
    parser.add_argument("--tokenizer_path", default=defaults.tokenizer,
                        help="the tokenizer, as given to the trainer (unset: beside the text encoder)")


def read_flags(parser: argparse.ArgumentParser, args: argparse.Namespace, weights: Sequence[Weights], full: bool,
               inputs: Mapping[str, InputFlag], suffixes: Sequence[str], title: str) -> Rendering:
    """The checked flags; every problem found stops the script through ``parser.error`` before a model loads.

    ``suffixes`` are the output formats the script writes (``.png``...); ``title`` names the release in the message
    of a missing required input. The second of several trained files may be ``none``: that slot renders as released.
    """
    paths = [getattr(args, entry.flag[2:]) for entry in weights]
    paths = ["" if index and path.lower() == "none" else path for index, path in enumerate(paths)]
    for entry, path in zip(weights, paths):
        if path and not Path(path).is_file():
            parser.error(f"{entry.flag} {path}: no such file; pass an epoch-<e>.safetensors or step-<s>.safetensors "
                         "file from the training run's --output_path")
    for flag in ("output", "before_after"):
        value = getattr(args, flag, None)
        if value is not None and Path(value).suffix.lower() not in suffixes:
            parser.error(f"--{flag} {value}: the suffix picks the format; end it in {' or '.join(suffixes)}")
    _check_inputs(parser, args, inputs, title)
    for flag in ("height", "width", "steps"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            parser.error(f"--{flag} {value} must be positive; leave it out for the pipeline's default")
    call = {"negative_prompt": args.negative_prompt, "seed": args.seed, "cfg_scale": args.cfg_scale,
            "height": args.height, "width": args.width, "num_inference_steps": args.steps}
    return Rendering(
        weights=tuple((entry.flag, entry.slots, path) for entry, path in zip(weights, paths)), full=full,
        strength=1.0 if full else args.lora_alpha_scale, output=Path(args.output), device=args.device,
        torch_dtype=args.torch_dtype, models=args.model_id_with_origin_paths, tokenizer=args.tokenizer_path,
        inputs={name: getattr(args, name) for name in inputs},
        call={"prompt": args.prompt, **{key: value for key, value in call.items() if value is not None}},
        before_after=getattr(args, "before_after", None), caption=getattr(args, "caption", ""),
    )  # fmt: skip


def _check_inputs(parser: argparse.ArgumentParser, args: argparse.Namespace, inputs: Mapping[str, InputFlag],
                  title: str) -> None:
    """Required inputs given, and every file an input names on disk."""
    missing = [name for name, entry in inputs.items() if entry.required and getattr(args, name) is None]
    if missing:
        parser.error(f"{title} needs --{' and --'.join(missing)}: "
                     + "; ".join(f"--{name}: {inputs[name].help}" for name in missing))
    for name, entry in inputs.items():
        value = getattr(args, name)
        if entry.kind == "folder" and value is not None and not Path(value).is_dir():
            parser.error(f"--{name} {value}: no such folder; pass {entry.help}, or drop the flag")
        if entry.kind not in FILE_KINDS or value is None:
            continue
        for path in value if entry.kind == "images" else [value]:
            if not Path(path).is_file():
                parser.error(f"--{name} {path}: no such file; pass {entry.help}")
