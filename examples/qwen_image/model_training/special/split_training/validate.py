"""Renders one image with Qwen-Image and the LoRA ``special/split_training/`` trains merged into its transformer
(``validate_lora/Qwen-Image.py`` names the release and its defaults; ``Qwen-Image-LoRA.sh`` there trains it in two
stages, the second writing the LoRA).

    python examples/qwen_image/model_training/special/split_training/validate.py \
        --lora_path ./models/train/Qwen-Image_lora/epoch-4.safetensors
"""

from __future__ import annotations

from pathlib import Path

from diffsynth.training.validate import release_script

SCRIPT = release_script(Path(__file__).parents[2] / "validate_lora" / "Qwen-Image.py")
SCRIPT = SCRIPT.with_trained("./models/train/Qwen-Image_lora/epoch-4.safetensors")
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
