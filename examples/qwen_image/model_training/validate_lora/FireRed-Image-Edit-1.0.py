"""Renders one image with FireRed-Image-Edit-1.0 and a trained LoRA merged into its transformer, to see what it learned
(``diffsynth.training.validate``: the flags, their checks and the steps).

    python examples/qwen_image/model_training/validate_lora/FireRed-Image-Edit-1.0.py \
        --lora_path ./models/train/FireRed-Image-Edit-1.0_lora/epoch-4.safetensors \
        --edit_image edit_image.png

``--lora_alpha_scale 0`` renders the base model from the same seed; ``--before_after`` renders both from one load. The
models load as ``lora/FireRed-Image-Edit-1.0.sh`` trains on them; the defaults are the reference script's.
"""

from __future__ import annotations

from diffsynth.training.validate import ImageScript

SCRIPT = ImageScript(
    name="FireRed-Image-Edit-1.0",
    pipeline="diffsynth.pipelines.qwen_image:QwenImagePipeline",
    models=("FireRedTeam/FireRed-Image-Edit-1.0:transformer/diffusion_pytorch_model*.safetensors,"
            "Qwen/Qwen-Image:text_encoder/model*.safetensors,"
            "Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors"),
    trained="./models/train/FireRed-Image-Edit-1.0_lora/epoch-4.safetensors",
    inputs=("edit_image", "processor_path", "zero_cond_t"),
    required=("edit_image",),
    prompt="Change the color of the dress in Figure 1 to the color shown in Figure 2.",
    call=dict(seed=123, num_inference_steps=40),
    input_defaults={"as_list": True},
)
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
