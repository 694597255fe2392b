"""Renders one image with JoyAI-Image-Edit and a trained LoRA merged into its transformer, to see what it learned
(``diffsynth.training.validate``: the flags, their checks and the steps).

    python examples/joyai_image/model_training/validate_lora/JoyAI-Image-Edit.py \
        --lora_path ./models/train/JoyAI-Image-Edit-lora/epoch-4.safetensors \
        --edit_image edit_image.png

``--lora_alpha_scale 0`` renders the base model from the same seed; ``--before_after`` renders both from one load. The
models load as ``lora/JoyAI-Image-Edit.sh`` trains on them; the defaults are the reference script's.
"""

from __future__ import annotations

from diffsynth.training.validate import ImageScript

SCRIPT = ImageScript(
    name="JoyAI-Image-Edit",
    pipeline="diffsynth.pipelines.joyai_image:JoyAIImagePipeline",
    models=("jd-opensource/JoyAI-Image-Edit:JoyAI-Image-Und/model*.safetensors,"
            "jd-opensource/JoyAI-Image-Edit:vae/Wan2.1_VAE.pth,"
            "jd-opensource/JoyAI-Image-Edit:transformer/transformer.pth"),
    trained="./models/train/JoyAI-Image-Edit-lora/epoch-4.safetensors",
    inputs=("edit_image", "processor_path"),
    required=("edit_image",),
    prompt="将裙子改为粉色",
    call=dict(height=1024, width=1024, num_inference_steps=30, cfg_scale=5.0),
    output="image_lora.jpg",
)
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
