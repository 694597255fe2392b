"""Renders one image with Qwen-Image-Distill-LoRA and a trained LoRA merged into its transformer, to see what it learned
(``diffsynth.training.validate``: the flags, their checks and the steps).

    python examples/qwen_image/model_training/validate_lora/Qwen-Image-Distill-LoRA.py \
        --lora_path ./models/train/Qwen-Image-Distill-LoRA_lora/epoch-4.safetensors

``--lora_alpha_scale 0`` renders the base model from the same seed; ``--before_after`` renders both from one load. The
models load as ``lora/Qwen-Image-Distill-LoRA.sh`` trains on them; the defaults are the reference script's.
"""

from __future__ import annotations

from diffsynth.training.validate import ImageScript

SCRIPT = ImageScript(
    name="Qwen-Image-Distill-LoRA",
    pipeline="diffsynth.pipelines.qwen_image:QwenImagePipeline",
    models=("Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors,"
            "Qwen/Qwen-Image:text_encoder/model*.safetensors,"
            "Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors"),
    trained="./models/train/Qwen-Image-Distill-LoRA_lora/epoch-4.safetensors",
    prompt="精致肖像，水下少女，蓝裙飘逸，发丝轻扬，光影透澈，气泡环绕，面容恬静，细节精致，梦幻唯美。",
    call=dict(num_inference_steps=4, cfg_scale=1.0),
)
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
