"""Renders one image with Z-Image and a trained LoRA merged into its transformer, to see what it learned
(``diffsynth.training.validate``: the flags, their checks and the steps).

    python examples/z_image/model_training/validate_lora/Z-Image.py \
        --lora_path ./models/train/Z-Image_lora/epoch-4.safetensors

``--lora_alpha_scale 0`` renders the base model from the same seed; ``--before_after`` renders both from one load. The
models load as ``lora/Z-Image.sh`` trains on them; the defaults are the reference script's.
"""

from __future__ import annotations

from diffsynth.training.validate import ImageScript

SCRIPT = ImageScript(
    name="Z-Image",
    pipeline="diffsynth.pipelines.z_image:ZImagePipeline",
    models=("Tongyi-MAI/Z-Image:transformer/*.safetensors,"
            "Tongyi-MAI/Z-Image-Turbo:text_encoder/*.safetensors,"
            "Tongyi-MAI/Z-Image-Turbo:vae/diffusion_pytorch_model.safetensors"),
    trained="./models/train/Z-Image_lora/epoch-4.safetensors",
    call=dict(seed=42, num_inference_steps=50, cfg_scale=4.0),
)
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
