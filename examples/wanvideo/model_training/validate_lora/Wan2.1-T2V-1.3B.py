"""Renders one clip with Wan2.1-T2V-1.3B and a trained LoRA merged into its transformer, to see what it learned.

    python examples/wanvideo/model_training/validate_lora/Wan2.1-T2V-1.3B.py \
        --lora_path ./models/train/Wan2.1-T2V-1.3B_lora/epoch-4.safetensors --prompt "a corgi running on a beach"

The LoRA's weights are added into the transformer's (``diffsynth.lora.load_lora``), so sampling costs what it costs
without a LoRA; only reloading the model takes them out again. ``--lora_alpha_scale 0`` renders the base model from
the same seed, for a side-by-side comparison. The models wait on the CPU and visit the device one at a time.

Sampling uses this package's flow-matching Euler schedule (shift 5), the one the trainer trains with; diffusers'
``WanPipeline`` uses UniPC with shift 3 instead (see ``diffsynth.pipelines.wan_video.pipeline``). At the defaults (81 frames,
832 x 480, 50 steps, guidance doubling the work) a clip takes minutes on one consumer GPU; lower --num_frames and --steps
for a quick look.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import torch

from diffsynth.core import parse_model_id_with_origin_paths
from diffsynth.lora import load_lora
from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline, save_video

# The original release files, as lora/Wan2.1-T2V-1.3B.sh trains on them (the tokenizer: google/umt5-xxl/ beside them).
MODEL_ID = "Wan-AI/Wan2.1-T2V-1.3B"
MODEL_ID_WITH_ORIGIN_PATHS = ",".join(f"{MODEL_ID}:{pattern}" for pattern in (
    "diffusion_pytorch_model*.safetensors", "models_t5_umt5-xxl-enc-bf16.pth", "Wan2.1_VAE.pth"))
VIDEO_SUFFIXES = (".mp4", ".gif")


def build_parser() -> argparse.ArgumentParser:
    """The script's flags; the defaults read the last LoRA that ``lora/Wan2.1-T2V-1.3B.sh`` writes."""
    parser = argparse.ArgumentParser(description="Render a clip with a Wan2.1-T2V-1.3B LoRA merged into the model.")
    parser.add_argument("--lora_path", default="./models/train/Wan2.1-T2V-1.3B_lora/epoch-4.safetensors",
                        help="LoRA .safetensors written by the trainer (or another diffusers-format Wan LoRA)")
    parser.add_argument("--lora_alpha_scale", type=float, default=1.0,
                        help="multiplies the LoRA's own alpha / rank scale; 0 renders the base model")
    parser.add_argument("--prompt", default="a corgi running along a sunny beach, the camera following it",
                        help="what the clip shows")
    parser.add_argument("--negative_prompt", default="blurry, distorted, static, low quality, watermark, subtitles",
                        help="what to steer away from (with --cfg_scale other than 1)")
    parser.add_argument("--cfg_scale", type=float, default=5.0, help="classifier-free guidance; 1 turns it off")
    parser.add_argument("--output", default="video.mp4", help="file to write: .mp4 (H.264) or .gif")
    parser.add_argument("--height", type=int, default=480, help="frame height in pixels (rounded to a multiple of 16)")
    parser.add_argument("--width", type=int, default=832, help="frame width in pixels (rounded to a multiple of 16)")
    parser.add_argument("--num_frames", type=int, default=81, help="frames in the clip, 4k+1 (others are rounded down)")
    parser.add_argument("--steps", type=int, default=50, help="denoising steps")
    parser.add_argument("--seed", type=int, default=0, help="noise seed; the same seed gives the same clip")
    parser.add_argument("--fps", type=int, default=15, help="frame rate written into the file")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="compute device (default: cuda when available, else cpu)")
    parser.add_argument("--torch_dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                        help="dtype of the weights and the computation")
    parser.add_argument("--model_id_with_origin_paths", default=MODEL_ID_WITH_ORIGIN_PATHS,
                        help="comma list of model_id:file_pattern entries, as given to the trainer")
    return parser


def main(argv: Sequence[str] | None = None) -> Path:
    """Loads the pipeline, merges the LoRA, renders the prompt and writes the clip.

    Returns:
        The video file written.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    # Everything that can be wrong with the flags is reported before the models load, which takes minutes.
    if not Path(args.lora_path).is_file():
        parser.error(f"--lora_path {args.lora_path}: no such file; pass an epoch-<e>.safetensors or "
                     f"step-<s>.safetensors file from the training run's --output_path")
    if Path(args.output).suffix.lower() not in VIDEO_SUFFIXES:
        parser.error(f"--output {args.output}: the suffix picks the format; end it in .mp4 or .gif")
    if args.num_frames < 1 or args.fps < 1:
        parser.error(f"--num_frames {args.num_frames} and --fps {args.fps} must be positive; e.g. --num_frames 81 "
                     f"--fps 15")
    configs = parse_model_id_with_origin_paths(args.model_id_with_origin_paths)
    pipe = WanVideoPipeline.from_pretrained(torch_dtype=args.torch_dtype, device=args.device, model_configs=configs)
    layers = load_lora(pipe.dit, args.lora_path, alpha=args.lora_alpha_scale)
    print(f"merged {layers} LoRA layers from {args.lora_path} (scale {args.lora_alpha_scale})")
    frames = pipe(args.prompt, negative_prompt=args.negative_prompt, cfg_scale=args.cfg_scale, height=args.height,
                  width=args.width, num_frames=args.num_frames, seed=args.seed, num_inference_steps=args.steps)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    save_video(frames, output, fps=args.fps)
    print(f"{len(frames)} frames written to {output.resolve()}")
    return output


if __name__ == "__main__":
    main()
