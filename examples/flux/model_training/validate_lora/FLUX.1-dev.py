"""Renders one image with FLUX.1-dev and a trained LoRA merged into its transformer, to see what it learned
(``diffsynth.training.validate``: the flags, their checks and the steps).

    python examples/flux/model_training/validate_lora/FLUX.1-dev.py \
        --lora_path ./models/train/FLUX.1-dev_lora/epoch-4.safetensors

``--lora_alpha_scale 0`` renders the base model from the same seed; ``--before_after`` renders both from one load. The
models load as ``lora/FLUX.1-dev.sh`` trains on them; the defaults are the reference script's.
"""

from __future__ import annotations

from diffsynth.training.validate import ImageScript

SCRIPT = ImageScript(
    name="FLUX.1-dev",
    pipeline="diffsynth.pipelines.flux:FluxPipeline",
    models=("black-forest-labs/FLUX.1-dev:flux1-dev.safetensors,"
            "black-forest-labs/FLUX.1-dev:text_encoder/model.safetensors,"
            "black-forest-labs/FLUX.1-dev:text_encoder_2/*.safetensors,"
            "black-forest-labs/FLUX.1-dev:ae.safetensors"),
    trained="./models/train/FLUX.1-dev_lora/epoch-4.safetensors",
    output="image_FLUX.1-dev_lora.jpg",
)
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
