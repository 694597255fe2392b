"""Renders one layer with Qwen-Image-Layered-Control and a trained LoRA merged into its transformer: the layer of the
input image that the prompt names (``diffsynth.training.validate``: the flags, their checks and the steps).

    python examples/qwen_image/model_training/validate_lora/Qwen-Image-Layered-Control.py \
        --lora_path ./models/train/Qwen-Image-Layered-Control_lora/epoch-4.safetensors \
        --layer_input_image image.png

``--layer_num`` is 0 (one layer extracted). ``--lora_alpha_scale 0`` renders the base model from the same seed;
``--before_after`` renders both from one load. The models load as ``lora/Qwen-Image-Layered-Control.sh`` trains on
them; the defaults are the reference script's.
"""

from __future__ import annotations

from diffsynth.training.validate import ImageScript

SCRIPT = ImageScript(
    name="Qwen-Image-Layered-Control",
    pipeline="diffsynth.pipelines.qwen_image:QwenImagePipeline",
    models=("DiffSynth-Studio/Qwen-Image-Layered-Control:transformer/diffusion_pytorch_model*.safetensors,"
            "Qwen/Qwen-Image:text_encoder/model*.safetensors,"
            "Qwen/Qwen-Image-Layered:vae/diffusion_pytorch_model.safetensors"),
    trained="./models/train/Qwen-Image-Layered-Control_lora/epoch-4.safetensors",
    inputs=("layer_input_image",),
    required=("layer_input_image",),
    prompt="Text 'HELLO' and 'Have a great day'",
    call=dict(height=480, width=864),
    output="image.png",
    input_defaults={"layer_num": 0},
)
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
