"""Renders one image with ERNIE-Image and a full fine-tune of its transformer loaded over the released weights, to see
what the fine-tune learned (``validate_lora/ERNIE-Image.py`` names the release; ``diffsynth.training.validate`` does the
steps).

    python examples/ernie_image/model_training/validate_full/ERNIE-Image.py \
        --checkpoint_path ./models/train/Ernie-Image-T2I_full/epoch-1.safetensors

``full/ERNIE-Image.sh`` writes that file (the transformer's trained weights under their own names); the other models
load as it trains on them.
"""

from __future__ import annotations

from pathlib import Path

from diffsynth.training.validate import release_script

SCRIPT = release_script(Path(__file__).parents[1] / "validate_lora" / "ERNIE-Image.py")
SCRIPT = SCRIPT.with_full("./models/train/Ernie-Image-T2I_full/epoch-1.safetensors", output="image_full.jpg")
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
