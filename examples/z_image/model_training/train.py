"""Z-Image / Z-Image-Turbo LoRA and full training; run with `accelerate launch` and the flags in lora/, full/ and
special/."""

from diffsynth.training import cli

if __name__ == "__main__":
    cli("diffsynth.pipelines.z_image:ZImagePipeline")
