"""Renders one image with Krea-2-Turbo and a full fine-tune of its transformer loaded over the released weights, to see
what the fine-tune learned (``validate_lora/Krea-2-Turbo.py`` names the release; ``diffsynth.training.validate`` does
the steps).

    python examples/krea2/model_training/validate_full/Krea-2-Turbo.py \
        --checkpoint_path ./models/train/Krea-2-Turbo_full/epoch-1.safetensors

``full/Krea-2-Turbo.sh`` writes that file (the transformer's trained weights under their own names); the other models
load as it trains on them.
"""

from __future__ import annotations

from pathlib import Path

from diffsynth.training.validate import release_script

SCRIPT = release_script(Path(__file__).parents[1] / "validate_lora" / "Krea-2-Turbo.py")
SCRIPT = SCRIPT.with_full("./models/train/Krea-2-Turbo_full/epoch-1.safetensors")
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
