"""Wan LoRA / full training; run with `accelerate launch` and the flags in lora/ and special/."""

from diffsynth.training import cli

if __name__ == "__main__":
    cli("diffsynth.pipelines.wan_video:WanVideoPipeline", video=True)
