"""Renders one image with stable-diffusion-xl-base-1.0 and a trained LoRA merged into its UNet, to see what it learned
(``diffsynth.training.validate``: the flags, their checks and the steps).

    python examples/stable_diffusion_xl/model_training/validate_lora/stable-diffusion-xl-base-1.0.py \
        --lora_path ./models/train/stable-diffusion-xl-base-1.0_lora/epoch-4.safetensors

``--lora_alpha_scale 0`` renders the base model from the same seed; ``--before_after`` renders both from one load. The
models load as ``lora/stable-diffusion-xl-base-1.0.sh`` trains on them; the defaults are the reference script's.
"""

from __future__ import annotations

from diffsynth.training.validate import ImageScript

SCRIPT = ImageScript(
    name="stable-diffusion-xl-base-1.0",
    pipeline="diffsynth.pipelines.stable_diffusion:StableDiffusionXLPipeline",
    models=("stabilityai/stable-diffusion-xl-base-1.0:text_encoder/model.safetensors,"
            "stabilityai/stable-diffusion-xl-base-1.0:text_encoder_2/model.safetensors,"
            "stabilityai/stable-diffusion-xl-base-1.0:unet/diffusion_pytorch_model.safetensors,"
            "stabilityai/stable-diffusion-xl-base-1.0:vae/diffusion_pytorch_model.safetensors"),
    trained="./models/train/stable-diffusion-xl-base-1.0_lora/epoch-4.safetensors",
    slots=("unet",),
    call=dict(cfg_scale=7.0, height=1024, width=1024, seed=42, num_inference_steps=50),
    output="image_stable-diffusion-xl-base-1.0.jpg",
)
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
