"""Renders one image with stable-diffusion-v1-5 and a trained LoRA merged into its UNet, to see what it learned
(``diffsynth.training.validate``: the flags, their checks and the steps).

    python examples/stable_diffusion/model_training/validate_lora/stable-diffusion-v1-5.py \
        --lora_path ./models/train/stable-diffusion-v1-5_lora/epoch-4.safetensors

``--lora_alpha_scale 0`` renders the base model from the same seed; ``--before_after`` renders both from one load. The
models load as ``lora/stable-diffusion-v1-5.sh`` trains on them; the defaults are the reference script's.
"""

from __future__ import annotations

from diffsynth.training.validate import ImageScript

SCRIPT = ImageScript(
    name="stable-diffusion-v1-5",
    pipeline="diffsynth.pipelines.stable_diffusion:StableDiffusionPipeline",
    models=("AI-ModelScope/stable-diffusion-v1-5:text_encoder/model.safetensors,"
            "AI-ModelScope/stable-diffusion-v1-5:unet/diffusion_pytorch_model.safetensors,"
            "AI-ModelScope/stable-diffusion-v1-5:vae/diffusion_pytorch_model.safetensors"),
    trained="./models/train/stable-diffusion-v1-5_lora/epoch-4.safetensors",
    slots=("unet",),
    call=dict(negative_prompt="blurry, low quality, deformed",
              cfg_scale=7.5,
              height=512,
              width=512,
              seed=42,
              num_inference_steps=50),
    output="image_stable-diffusion-v1-5.jpg",
)
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
