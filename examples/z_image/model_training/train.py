"""Z-Image / Z-Image-Turbo LoRA and full training; run with `accelerate launch` and the flags in lora/, full/ and
special/."""

from diffsynth.pipelines.z_image import ZImagePipeline
from diffsynth.training import cli

if __name__ == "__main__":
    cli(ZImagePipeline)
