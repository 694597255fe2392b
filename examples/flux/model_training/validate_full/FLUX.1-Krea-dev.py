"""Renders one image with FLUX.1-Krea-dev and a full fine-tune of its transformer loaded over the released weights, to
see what the fine-tune learned (``validate_lora/FLUX.1-Krea-dev.py`` names the release; ``diffsynth.training.validate``
does the steps).

    python examples/flux/model_training/validate_full/FLUX.1-Krea-dev.py \
        --checkpoint_path ./models/train/FLUX.1-Krea-dev_full/epoch-0.safetensors

``full/FLUX.1-Krea-dev.sh`` writes that file (the transformer's trained weights under their own names); the other models
load as it trains on them.
"""

from __future__ import annotations

from pathlib import Path

from diffsynth.training.validate import release_script

SCRIPT = release_script(Path(__file__).parents[1] / "validate_lora" / "FLUX.1-Krea-dev.py")
SCRIPT = SCRIPT.with_full(
    "./models/train/FLUX.1-Krea-dev_full/epoch-0.safetensors",
    output="image_FLUX.1-Krea-dev_full.jpg",
)
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
