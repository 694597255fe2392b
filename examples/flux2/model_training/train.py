"""FLUX.2 [klein] and [dev] training; run with `accelerate launch` and the flags in lora/, full/ and special/."""

from diffsynth.training import cli

if __name__ == "__main__":
    cli("diffsynth.pipelines.flux2_klein:Flux2KleinPipeline")
