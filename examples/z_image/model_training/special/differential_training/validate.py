"""Renders one image with Z-Image-Turbo and the LoRA ``special/differential_training/`` trains merged into its
transformer (``validate_lora/Z-Image-Turbo.py`` names the release and its defaults; ``Z-Image-Turbo.sh`` there trains
it).

    python examples/z_image/model_training/special/differential_training/validate.py \
        --lora_path ./models/train/Z-Image-Turbo_lora_differential/epoch-4.safetensors
"""

from __future__ import annotations

from pathlib import Path

from diffsynth.training.validate import release_script

SCRIPT = release_script(Path(__file__).parents[2] / "validate_lora" / "Z-Image-Turbo.py")
SCRIPT = SCRIPT.with_trained("./models/train/Z-Image-Turbo_lora_differential/epoch-4.safetensors")
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
