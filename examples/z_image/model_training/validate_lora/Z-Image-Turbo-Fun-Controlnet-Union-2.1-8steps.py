"""Renders one image with Z-Image-Turbo-Fun-Controlnet-Union-2.1-8steps and a trained LoRA merged into its transformer,
to see what it learned (``diffsynth.training.validate``: the flags, their checks and the steps).

    python examples/z_image/model_training/validate_lora/Z-Image-Turbo-Fun-Controlnet-Union-2.1-8steps.py \
        --lora_path ./models/train/Z-Image-Turbo-Fun-Controlnet-Union-2.1-8steps_lora/epoch-4.safetensors \
        --controlnet_image controlnet_image.png

``--lora_alpha_scale 0`` renders the base model from the same seed; ``--before_after`` renders both from one load. The
models load as ``lora/Z-Image-Turbo-Fun-Controlnet-Union-2.1-8steps.sh`` trains on them; the defaults are the reference
script's.
"""

from __future__ import annotations

from diffsynth.training.validate import ImageScript

SCRIPT = ImageScript(
    name="Z-Image-Turbo-Fun-Controlnet-Union-2.1-8steps",
    pipeline="diffsynth.pipelines.z_image:ZImagePipeline",
    models=("PAI/Z-Image-Turbo-Fun-Controlnet-Union-2.1:Z-Image-Turbo-Fun-Controlnet-Union-2.1-8steps.safetensors,"
            "Tongyi-MAI/Z-Image-Turbo:transformer/*.safetensors,"
            "Tongyi-MAI/Z-Image-Turbo:text_encoder/*.safetensors,"
            "Tongyi-MAI/Z-Image-Turbo:vae/diffusion_pytorch_model.safetensors"),
    trained="./models/train/Z-Image-Turbo-Fun-Controlnet-Union-2.1-8steps_lora/epoch-4.safetensors",
    inputs=("controlnet_image",),
    required=("controlnet_image",),
    call=dict(height=1024, width=1024),
    output="image_control.jpg",
    control_input="diffsynth.pipelines.z_image:ControlNetInput",
)
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
