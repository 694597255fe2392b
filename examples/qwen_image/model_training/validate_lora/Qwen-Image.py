"""Generates one image with Qwen-Image and a trained LoRA merged into its transformer, to check what it learned.

    python examples/qwen_image/model_training/validate_lora/Qwen-Image.py \
        --lora_path ./models/train/Qwen-Image_lora/epoch-4.safetensors --prompt "a dog on a beach"

The LoRA is merged into the weights (``diffsynth.lora.load_lora``): no adapter runs at inference time, and the merge
is undone only by reloading the model. ``--before_after before_after.png`` also renders the base model first, with
the same prompt and seed, and writes both side by side with their difference (``--lora_alpha_scale 0`` alone renders
only the base model). Models wait on the CPU and move to the device one at a time while they compute.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import torch

from diffsynth.core import parse_model_id_with_origin_paths
from diffsynth.lora import load_lora
from diffsynth.lora.before_after import save_before_after
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline

MODEL_ID_WITH_ORIGIN_PATHS = (
    "Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors,"
    "Qwen/Qwen-Image:text_encoder/model*.safetensors,"
    "Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors"
)


def build_parser() -> argparse.ArgumentParser:
    """The script's flags; the defaults match the output of ``lora/Qwen-Image.sh``."""
    parser = argparse.ArgumentParser(description="Render an image with a Qwen-Image LoRA merged into the model.")
    parser.add_argument("--lora_path", default="./models/train/Qwen-Image_lora/epoch-4.safetensors",
                        help="LoRA .safetensors file written by the trainer (or any diffusers / kohya Qwen-Image LoRA)")
    parser.add_argument("--lora_alpha_scale", type=float, default=1.0,
                        help="strength of the LoRA on top of its own alpha / rank; 0 renders the base model")
    parser.add_argument("--prompt", default="a dog sitting on a sunny beach, photograph", help="what to draw")
    parser.add_argument("--negative_prompt", default="", help="what to steer away from (with --cfg_scale above 1)")
    parser.add_argument("--cfg_scale", type=float, default=4.0, help="classifier-free guidance; 1 turns it off")
    parser.add_argument("--output", default="image.jpg", help="image file to write; the suffix picks the format")
    parser.add_argument("--before_after", default=None,
                        help="also render without the LoRA (same prompt and seed) and write both, side by side with "
                             "their difference, to this file")
    parser.add_argument("--caption", default="", help="text under the --before_after picture")
    parser.add_argument("--height", type=int, default=1328, help="image height in pixels (rounded to a multiple of 16)")
    parser.add_argument("--width", type=int, default=1328, help="image width in pixels (rounded to a multiple of 16)")
    parser.add_argument("--steps", type=int, default=30, help="denoising steps")
    parser.add_argument("--seed", type=int, default=0, help="noise seed; the same seed gives the same image")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="compute device (default: cuda when available, else cpu)")
    parser.add_argument("--torch_dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                        help="dtype of the weights and the computation")
    parser.add_argument("--model_id_with_origin_paths", default=MODEL_ID_WITH_ORIGIN_PATHS,
                        help="comma list of model_id:file_pattern entries, as for the trainer")
    return parser


def main(argv: Sequence[str] | None = None) -> Path:
    """Loads the pipeline, merges the LoRA, renders the prompt and saves the image.

    Returns:
        The image file written.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    # Cheap checks first: loading Qwen-Image takes minutes.
    if not Path(args.lora_path).is_file():
        parser.error(f"--lora_path {args.lora_path}: no such file; pass the epoch-<e>.safetensors or "
                     f"step-<s>.safetensors file of a training run")
    configs = parse_model_id_with_origin_paths(args.model_id_with_origin_paths)
    pipe = QwenImagePipeline.from_pretrained(torch_dtype=args.torch_dtype, device=args.device, model_configs=configs)

    def render():
        return pipe(args.prompt, negative_prompt=args.negative_prompt, cfg_scale=args.cfg_scale, height=args.height,
                    width=args.width, seed=args.seed, num_inference_steps=args.steps)

    before = render() if args.before_after else None  # the merge below cannot be undone
    layers = load_lora(pipe.dit, args.lora_path, alpha=args.lora_alpha_scale)
    print(f"merged {layers} LoRA layers from {args.lora_path} (scale {args.lora_alpha_scale})")
    image = render()
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    image.save(output)
    print(f"image written to {output.resolve()}")
    if before is not None:
        path, change = save_before_after(before, image, args.before_after, args.caption)
        print(f"without and with the LoRA, and their difference ({change.describe()}), written to {path.resolve()}")
    return output


if __name__ == "__main__":
    main()
