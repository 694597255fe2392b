"""Renders one image with Qwen-Image, the Inpaint Blockwise ControlNet and a trained LoRA merged into the transformer,
steered by an image to fill and its mask (``diffsynth.training.validate``: the flags, their checks and the steps).

    python examples/qwen_image/model_training/validate_lora/Qwen-Image-Blockwise-ControlNet-Inpaint.py \
        --lora_path ./models/train/Qwen-Image-Blockwise-ControlNet-Inpaint_lora/epoch-4.safetensors \
        --blockwise_controlnet_image image.jpg --blockwise_controlnet_inpaint_mask mask.jpg

The control image is resized to the output size. ``--lora_alpha_scale 0`` renders without the LoRA from the same
seed; ``--before_after`` renders both from one load. The models load as
``lora/Qwen-Image-Blockwise-ControlNet-Inpaint.sh`` trains on them; the prompt is the reference script's.
"""

from __future__ import annotations

from diffsynth.training.validate import ImageScript

SCRIPT = ImageScript(
    name="Qwen-Image-Blockwise-ControlNet-Inpaint",
    pipeline="diffsynth.pipelines.qwen_image:QwenImagePipeline",
    models=("Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors,"
            "Qwen/Qwen-Image:text_encoder/model*.safetensors,"
            "Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors,"
            "DiffSynth-Studio/Qwen-Image-Blockwise-ControlNet-Inpaint:model.safetensors"),
    trained="./models/train/Qwen-Image-Blockwise-ControlNet-Inpaint_lora/epoch-4.safetensors",
    inputs=("blockwise_controlnet_image", "blockwise_controlnet_inpaint_mask"),
    required=("blockwise_controlnet_image", "blockwise_controlnet_inpaint_mask"),
    prompt="a cat with sunglasses",
    call=dict(height=1024, width=1024),
    output="image.jpg",
)
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
