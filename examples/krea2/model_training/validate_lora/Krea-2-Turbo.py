"""Renders one image with Krea-2-Turbo and a trained LoRA merged into its transformer, to see what it learned
(``diffsynth.training.validate``: the flags, their checks and the steps).

    python examples/krea2/model_training/validate_lora/Krea-2-Turbo.py \
        --lora_path ./models/train/Krea-2-Turbo_lora/epoch-4.safetensors

``--lora_alpha_scale 0`` renders the base model from the same seed; ``--before_after`` renders both from one load. The
models load as ``lora/Krea-2-Turbo.sh`` trains on them; the defaults are the reference script's.
"""

from __future__ import annotations

from diffsynth.training.validate import ImageScript

SCRIPT = ImageScript(
    name="Krea-2-Turbo",
    pipeline="diffsynth.pipelines.krea2:Krea2Pipeline",
    models=("krea/Krea-2-Turbo:turbo.safetensors,"
            "Qwen/Qwen3-VL-4B-Instruct:*.safetensors,"
            "Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors"),
    trained="./models/train/Krea-2-Turbo_lora/epoch-4.safetensors",
    tokenizer="Qwen/Qwen3-VL-4B-Instruct:",
    prompt="A dog",
    call=dict(num_inference_steps=52, cfg_scale=4.5),
)
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
