"""Renders one image with Qwen-Image and a trained In-Context-Control-Union LoRA merged into its transformer, steered
by a control image (``diffsynth.training.validate``: the flags, their checks and the steps).

    python examples/qwen_image/model_training/validate_lora/Qwen-Image-In-Context-Control-Union.py \
        --lora_path ./models/train/Qwen-Image-In-Context-Control-Union_lora/epoch-4.safetensors \
        --context_image canny.jpg

The control image is resized to the output size. ``--lora_alpha_scale 0`` renders the base model from the same seed;
``--before_after`` renders both from one load. The models load as ``lora/Qwen-Image-In-Context-Control-Union.sh``
trains on them; the prompt is the reference script's (the LoRA's ``Context_Control.`` trigger first).
"""

from __future__ import annotations

from diffsynth.training.validate import ImageScript

SCRIPT = ImageScript(
    name="Qwen-Image-In-Context-Control-Union",
    pipeline="diffsynth.pipelines.qwen_image:QwenImagePipeline",
    models=("Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors,"
            "Qwen/Qwen-Image:text_encoder/model*.safetensors,"
            "Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors"),
    trained="./models/train/Qwen-Image-In-Context-Control-Union_lora/epoch-4.safetensors",
    inputs=("context_image",),
    required=("context_image",),
    prompt="Context_Control. a dog",
    call=dict(height=1024, width=1024),
    output="image_context.jpg",
)
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
