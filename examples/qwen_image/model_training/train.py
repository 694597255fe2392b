"""Qwen-Image LoRA / full training; run with `accelerate launch` and the flags in lora/ and special/."""

from diffsynth.diffusion.trainer import cli
from diffsynth.pipelines.qwen_image import QwenImagePipeline

if __name__ == "__main__":
    cli(QwenImagePipeline)
