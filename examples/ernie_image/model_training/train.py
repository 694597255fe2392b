"""ERNIE-Image LoRA and full training; run with `accelerate launch` and the flags in lora/ and full/."""

from diffsynth.training import cli

if __name__ == "__main__":
    cli("diffsynth.pipelines.ernie_image:ErnieImagePipeline")
