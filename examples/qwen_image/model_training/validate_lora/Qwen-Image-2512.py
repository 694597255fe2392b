"""Renders one image with Qwen-Image-2512 and a trained LoRA merged into its transformer, to see what it learned
(``diffsynth.training.validate``: the flags, their checks and the steps).

    python examples/qwen_image/model_training/validate_lora/Qwen-Image-2512.py \
        --lora_path ./models/train/Qwen-Image-2512_lora/epoch-4.safetensors

``--lora_alpha_scale 0`` renders the base model from the same seed; ``--before_after`` renders both from one load. The
models load as ``lora/Qwen-Image-2512.sh`` trains on them; the defaults are the reference script's.
"""

from __future__ import annotations

from diffsynth.training.validate import ImageScript

SCRIPT = ImageScript(
    name="Qwen-Image-2512",
    pipeline="diffsynth.pipelines.qwen_image:QwenImagePipeline",
    models=("Qwen/Qwen-Image-2512:transformer/diffusion_pytorch_model*.safetensors,"
            "Qwen/Qwen-Image:text_encoder/model*.safetensors,"
            "Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors"),
    trained="./models/train/Qwen-Image-2512_lora/epoch-4.safetensors",
)
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
