"""Renders one image with Qwen-Image, the Canny Blockwise ControlNet and a trained LoRA merged into the transformer,
steered by a canny control image (``diffsynth.training.validate``: the flags, their checks and the steps).

    python examples/qwen_image/model_training/validate_lora/Qwen-Image-Blockwise-ControlNet-Canny.py \
        --lora_path ./models/train/Qwen-Image-Blockwise-ControlNet-Canny_lora/epoch-4.safetensors \
        --blockwise_controlnet_image image.jpg

The control image is resized to the output size. ``--lora_alpha_scale 0`` renders without the LoRA from the same
seed; ``--before_after`` renders both from one load. The models load as
``lora/Qwen-Image-Blockwise-ControlNet-Canny.sh`` trains on them; the prompt is the reference script's.
"""

from __future__ import annotations

from diffsynth.training.validate import ImageScript

SCRIPT = ImageScript(
    name="Qwen-Image-Blockwise-ControlNet-Canny",
    pipeline="diffsynth.pipelines.qwen_image:QwenImagePipeline",
    models=("Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors,"
            "Qwen/Qwen-Image:text_encoder/model*.safetensors,"
            "Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors,"
            "DiffSynth-Studio/Qwen-Image-Blockwise-ControlNet-Canny:model.safetensors"),
    trained="./models/train/Qwen-Image-Blockwise-ControlNet-Canny_lora/epoch-4.safetensors",
    inputs=("blockwise_controlnet_image",),
    required=("blockwise_controlnet_image",),
    prompt="一只小狗，毛发光洁柔顺，眼神灵动，背景是樱花纷飞的春日庭院，唯美温馨。",
    call=dict(height=1328, width=1328),
    output="image.jpg",
)
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
