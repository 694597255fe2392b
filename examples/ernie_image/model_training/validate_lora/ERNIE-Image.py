"""Renders one image with ERNIE-Image and a trained LoRA merged into its transformer, to see what it learned
(``diffsynth.training.validate``: the flags, their checks and the steps).

    python examples/ernie_image/model_training/validate_lora/ERNIE-Image.py \
        --lora_path ./models/train/Ernie-Image-T2I_lora/epoch-4.safetensors

``--lora_alpha_scale 0`` renders the base model from the same seed; ``--before_after`` renders both from one load. The
models load as ``lora/ERNIE-Image.sh`` trains on them; the defaults are the reference script's.
"""

from __future__ import annotations

from diffsynth.training.validate import ImageScript

SCRIPT = ImageScript(
    name="ERNIE-Image",
    pipeline="diffsynth.pipelines.ernie_image:ErnieImagePipeline",
    models=("PaddlePaddle/ERNIE-Image:transformer/diffusion_pytorch_model*.safetensors,"
            "PaddlePaddle/ERNIE-Image:text_encoder/model.safetensors,"
            "PaddlePaddle/ERNIE-Image:vae/diffusion_pytorch_model.safetensors"),
    trained="./models/train/Ernie-Image-T2I_lora/epoch-4.safetensors",
    prompt="a professional photo of a cute dog",
    call=dict(num_inference_steps=50, cfg_scale=4.0),
    output="image_lora.jpg",
)
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
