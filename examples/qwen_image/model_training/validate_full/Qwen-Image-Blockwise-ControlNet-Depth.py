"""Renders one image with Qwen-Image and a full fine-tune of the Depth Blockwise ControlNet loaded over the released
weights, to see what the fine-tune learned (``validate_lora/Qwen-Image-Blockwise-ControlNet-Depth.py`` names the
release; ``diffsynth.training.validate`` does the steps).

    python examples/qwen_image/model_training/validate_full/Qwen-Image-Blockwise-ControlNet-Depth.py \
        --checkpoint_path ./models/train/Qwen-Image-Blockwise-ControlNet-Depth_full/epoch-1.safetensors \
        --blockwise_controlnet_image image.jpg

``full/Qwen-Image-Blockwise-ControlNet-Depth.sh`` writes that file (the ControlNet's trained weights under the
release's names, with ``--remove_prefix_in_ckpt pipe.blockwise_controlnet.models.0.``); the other models load as it
trains on them.
"""

from __future__ import annotations

from pathlib import Path

from diffsynth.training.validate import release_script

SCRIPT = release_script(Path(__file__).parents[1] / "validate_lora" / "Qwen-Image-Blockwise-ControlNet-Depth.py")
SCRIPT = SCRIPT.with_full(
    "./models/train/Qwen-Image-Blockwise-ControlNet-Depth_full/epoch-1.safetensors",
    slots=("blockwise_controlnet.models.0",),
)
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
