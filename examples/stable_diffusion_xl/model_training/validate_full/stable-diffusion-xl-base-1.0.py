"""Renders one image with stable-diffusion-xl-base-1.0 and a full fine-tune of its UNet loaded over the released
weights, to see what the fine-tune learned (``validate_lora/stable-diffusion-xl-base-1.0.py`` names the release;
``diffsynth.training.validate`` does the steps).

    python examples/stable_diffusion_xl/model_training/validate_full/stable-diffusion-xl-base-1.0.py \
        --checkpoint_path ./models/train/stable-diffusion-xl-base-1.0_full/epoch-1.safetensors

``full/stable-diffusion-xl-base-1.0.sh`` writes that file (the UNet's trained weights under their own names); the other
models load as it trains on them.
"""

from __future__ import annotations

from pathlib import Path

from diffsynth.training.validate import release_script

SCRIPT = release_script(Path(__file__).parents[1] / "validate_lora" / "stable-diffusion-xl-base-1.0.py")
SCRIPT = SCRIPT.with_full(
    "./models/train/stable-diffusion-xl-base-1.0_full/epoch-1.safetensors",
    output="image_stable-diffusion-xl-base-1.0_full.jpg",
)
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
