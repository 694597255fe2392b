"""LTX-2 audio+video LoRA / full training; run with `accelerate launch` and the flags in lora/ and full/."""

from diffsynth.training import cli

if __name__ == "__main__":
    cli("diffsynth.pipelines.ltx2:LTX2AudioVideoPipeline", video=True)
