"""Renders one image with Qwen-Image-Layered and a full fine-tune of its transformer loaded over the released weights,
to see what the fine-tune learned (``validate_lora/Qwen-Image-Layered.py`` names the release;
``diffsynth.training.validate`` does the steps).

    python examples/qwen_image/model_training/validate_full/Qwen-Image-Layered.py \
        --checkpoint_path ./models/train/Qwen-Image-Layered_full/epoch-1.safetensors

``full/Qwen-Image-Layered.sh`` writes that file (the transformer's trained weights under their own names); the other
models load as it trains on them.
"""

from __future__ import annotations

from pathlib import Path

from diffsynth.training.validate import release_script

SCRIPT = release_script(Path(__file__).parents[1] / "validate_lora" / "Qwen-Image-Layered.py")
SCRIPT = SCRIPT.with_full("./models/train/Qwen-Image-Layered_full/epoch-1.safetensors")
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
