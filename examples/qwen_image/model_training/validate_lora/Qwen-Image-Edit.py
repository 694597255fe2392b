"""Edits an image with Qwen-Image-Edit (or Edit-2509 / 2511) and a trained LoRA merged into its transformer.

    python examples/qwen_image/model_training/validate_lora/Qwen-Image-Edit.py \
        --lora_path ./models/train/Qwen-Image-Edit_lora/epoch-4.safetensors \
        --edit_image data/example_edit_dataset/edit_000_1.png --prompt "make the circle blue"

For Edit-2509 or 2511, name their transformer and give the images in order (the prompt calls them picture 1, 2...):

    python examples/qwen_image/model_training/validate_lora/Qwen-Image-Edit.py \
        --model_id_with_origin_paths "Qwen/Qwen-Image-Edit-2509:transformer/diffusion_pytorch_model*.safetensors,..." \
        --lora_path ./models/train/Qwen-Image-Edit-2509_lora/epoch-4.safetensors \
        --edit_image person.png --edit_image colour.png --prompt "paint the dress in picture 1 the colour of picture 2"

Several edit images are passed as a list, which selects Edit-2509's prompt form; ``--as_list`` does so for one image
too. The LoRA is merged into the weights (``diffsynth.lora.load_lora``); ``--lora_alpha_scale 0`` renders the base
model with the same seed, for a before-and-after comparison. Unset ``--height`` / ``--width`` follow the (last) edit
image's aspect ratio at about 1024 x 1024 pixels.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import torch
from PIL import Image

from diffsynth.core import ModelConfig, parse_model_id_with_origin_paths
from diffsynth.lora import load_lora
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline

MODEL_ID_WITH_ORIGIN_PATHS = (
    "Qwen/Qwen-Image-Edit:transformer/diffusion_pytorch_model*.safetensors,"
    "Qwen/Qwen-Image:text_encoder/model*.safetensors,"
    "Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors"
)


def build_parser() -> argparse.ArgumentParser:
    """The script's flags; the defaults match the output of ``lora/Qwen-Image-Edit.sh``."""
    parser = argparse.ArgumentParser(description="Edit an image with a Qwen-Image-Edit LoRA merged into the model.")
    parser.add_argument("--lora_path", default="./models/train/Qwen-Image-Edit_lora/epoch-4.safetensors",
                        help="LoRA .safetensors file written by the trainer (or any diffusers Qwen-Image LoRA)")
    parser.add_argument("--lora_alpha_scale", type=float, default=1.0,
                        help="strength of the LoRA on top of its own alpha / rank; 0 renders the base model")
    parser.add_argument("--edit_image", action="append", required=True,
                        help="image to edit; repeat the flag for several (Edit-2509 / 2511), in picture order")
    parser.add_argument("--as_list", action="store_true",
                        help="pass a single --edit_image as a one-image list (Edit-2509 / 2511's prompt form)")
    parser.add_argument("--prompt", default="make the shape blue", help="the edit instruction")
    parser.add_argument("--negative_prompt", default="", help="what to steer away from (with --cfg_scale above 1)")
    parser.add_argument("--cfg_scale", type=float, default=4.0, help="classifier-free guidance; 1 turns it off")
    parser.add_argument("--output", default="image.jpg", help="image file to write; the suffix picks the format")
    parser.add_argument("--height", type=int, default=None,
                        help="output height in pixels (rounded to a multiple of 16); unset follows the edit image")
    parser.add_argument("--width", type=int, default=None,
                        help="output width in pixels (rounded to a multiple of 16); unset follows the edit image")
    parser.add_argument("--steps", type=int, default=30, help="denoising steps")
    parser.add_argument("--seed", type=int, default=0, help="noise seed; the same seed gives the same image")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="compute device (default: cuda when available, else cpu)")
    parser.add_argument("--torch_dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                        help="dtype of the weights and the computation")
    parser.add_argument("--model_id_with_origin_paths", default=MODEL_ID_WITH_ORIGIN_PATHS,
                        help="comma list of model_id:file_pattern entries, as for the trainer")
    parser.add_argument("--processor_path", default=None,
                        help="Qwen2.5-VL processor folder; unset takes the transformer repository's processor/")
    parser.add_argument("--zero_cond_t", action="store_true",
                        help="turn on Edit-2511's zero_cond_t (its own transformer config already does)")
    return parser


def main(argv: Sequence[str] | None = None) -> Path:
    """Loads the pipeline, merges the LoRA, edits the image(s) and saves the result.

    Returns:
        The image file written.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    # Cheap checks first: loading Qwen-Image takes minutes.
    if not Path(args.lora_path).is_file():
        parser.error(f"--lora_path {args.lora_path}: no such file; pass the epoch-<e>.safetensors or "
                     f"step-<s>.safetensors file of a training run")
    missing = [path for path in args.edit_image if not Path(path).is_file()]
    if missing:
        parser.error(f"--edit_image {missing[0]}: no such file; pass the image to edit")
    if args.processor_path is not None and not Path(args.processor_path).is_dir():
        parser.error(f"--processor_path {args.processor_path}: not a folder; pass a Qwen-Image-Edit repository's "
                     "processor/ folder, or drop the flag")
    images = [Image.open(path).convert("RGB") for path in args.edit_image]
    edit_image = images if args.as_list or len(images) > 1 else images[0]
    pipe = QwenImagePipeline.from_pretrained(
        torch_dtype=args.torch_dtype, device=args.device,
        model_configs=parse_model_id_with_origin_paths(args.model_id_with_origin_paths),
        processor_config=ModelConfig(path=args.processor_path) if args.processor_path else None,
        zero_cond_t=True if args.zero_cond_t else None,
    )  # fmt: skip
    layers = load_lora(pipe.dit, args.lora_path, alpha=args.lora_alpha_scale)
    print(f"merged {layers} LoRA layers from {args.lora_path} (scale {args.lora_alpha_scale})")
    image = pipe(args.prompt, negative_prompt=args.negative_prompt, cfg_scale=args.cfg_scale, edit_image=edit_image,
                 height=args.height, width=args.width, seed=args.seed, num_inference_steps=args.steps)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    image.save(output)
    print(f"image written to {output.resolve()}")
    return output


if __name__ == "__main__":
    main()
