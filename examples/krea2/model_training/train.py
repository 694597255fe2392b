"""Krea 2 (Krea-2-Raw / Krea-2-Turbo) LoRA and full training; run with `accelerate launch` and the flags in lora/ and
full/."""

from diffsynth.training import cli

if __name__ == "__main__":
    cli("diffsynth.pipelines.krea2:Krea2Pipeline")
