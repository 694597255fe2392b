"""Renders one image with Qwen-Image, the Depth Blockwise ControlNet and a trained LoRA merged into the transformer,
steered by a depth control image (``diffsynth.training.validate``: the flags, their checks and the steps).

    python examples/qwen_image/model_training/validate_lora/Qwen-Image-Blockwise-ControlNet-Depth.py \
        --lora_path ./models/train/Qwen-Image-Blockwise-ControlNet-Depth_lora/epoch-4.safetensors \
        --blockwise_controlnet_image image.jpg

The control image is resized to the output size. ``--lora_alpha_scale 0`` renders without the LoRA from the same
seed; ``--before_after`` renders both from one load. The models load as
``lora/Qwen-Image-Blockwise-ControlNet-Depth.sh`` trains on them; the prompt is the reference script's.
"""

from __future__ import annotations

from diffsynth.training.validate import ImageScript

SCRIPT = ImageScript(
    name="Qwen-Image-Blockwise-ControlNet-Depth",
    pipeline="diffsynth.pipelines.qwen_image:QwenImagePipeline",
    models=("Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors,"
            "Qwen/Qwen-Image:text_encoder/model*.safetensors,"
            "Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors,"
            "DiffSynth-Studio/Qwen-Image-Blockwise-ControlNet-Depth:model.safetensors"),
    trained="./models/train/Qwen-Image-Blockwise-ControlNet-Depth_lora/epoch-4.safetensors",
    inputs=("blockwise_controlnet_image",),
    required=("blockwise_controlnet_image",),
    prompt=("精致肖像，水下少女，蓝裙飘逸，发丝轻扬，光影透澈，"
            "气泡环绕，面容恬静，细节精致，梦幻唯美。"),
    call=dict(height=1328, width=1328),
    output="image.jpg",
)
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
