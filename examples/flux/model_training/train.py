"""FLUX.1 [dev], FLUX.1-Krea-dev and FLUX.1-Kontext-dev LoRA / full training; run with `accelerate launch` and the
flags in lora/ and full/."""

from diffsynth.training import cli

if __name__ == "__main__":
    cli("diffsynth.pipelines.flux:FluxPipeline")
