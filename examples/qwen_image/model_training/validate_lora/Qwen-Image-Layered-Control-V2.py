"""Renders one layer with Qwen-Image-Layered-Control and a trained V2 LoRA merged into its transformer: the layer of
the input image that the prompt names, or with ``--context_image`` the one a mask marks (``diffsynth.training.
validate``: the flags, their checks and the steps).

    python examples/qwen_image/model_training/validate_lora/Qwen-Image-Layered-Control-V2.py \
        --lora_path ./models/train/Qwen-Image-Layered-Control-V2_lora/epoch-4.safetensors \
        --layer_input_image image_2.png --context_image mask_2.png --cfg_scale 1

``--layer_num`` is 0 (one layer extracted). The reference script renders twice, by prompt (``--cfg_scale 4``) and by
mask (``--cfg_scale 1``); here one run renders one of them. ``--lora_alpha_scale 0`` renders the base model from the
same seed; ``--before_after`` renders both from one load. The models load as ``lora/Qwen-Image-Layered-Control-V2.sh``
trains on them.
"""

from __future__ import annotations

from diffsynth.training.validate import ImageScript

SCRIPT = ImageScript(
    name="Qwen-Image-Layered-Control-V2",
    pipeline="diffsynth.pipelines.qwen_image:QwenImagePipeline",
    models=("DiffSynth-Studio/Qwen-Image-Layered-Control:transformer/diffusion_pytorch_model*.safetensors,"
            "Qwen/Qwen-Image:text_encoder/model*.safetensors,"
            "Qwen/Qwen-Image-Layered:vae/diffusion_pytorch_model.safetensors"),
    trained="./models/train/Qwen-Image-Layered-Control-V2_lora/epoch-4.safetensors",
    inputs=("layer_input_image", "context_image"),
    required=("layer_input_image",),
    prompt="Text 'APRIL'",
    call=dict(height=1024, width=1024, num_inference_steps=10, cfg_scale=4),
    output="image_prompt.png",
    input_defaults={"layer_num": 0},
)
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
