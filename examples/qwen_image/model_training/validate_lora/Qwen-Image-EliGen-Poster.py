"""Renders one image with Qwen-Image and a trained EliGen-Poster LoRA merged into its transformer: each entity
prompt drawn inside its mask's region (``diffsynth.training.validate``: the flags, their checks and the steps).

    python examples/qwen_image/model_training/validate_lora/Qwen-Image-EliGen-Poster.py \
        --lora_path ./models/train/Qwen-Image-EliGen-Poster_lora/epoch-4.safetensors \
        --eligen_entity_masks 0.png 1.png 2.png 3.png

The entity prompts default to the reference script's four (``--eligen_entity_prompts`` takes others, one per mask,
in the same order). ``--lora_alpha_scale 0`` renders the base model from the same seed; ``--before_after`` renders
both from one load. The models load as ``lora/Qwen-Image-EliGen-Poster.sh`` trains on them; the defaults are the
reference script's.
"""

from __future__ import annotations

from diffsynth.training.validate import ImageScript

SCRIPT = ImageScript(
    name="Qwen-Image-EliGen-Poster",
    pipeline="diffsynth.pipelines.qwen_image:QwenImagePipeline",
    models=("Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors,"
            "Qwen/Qwen-Image:text_encoder/model*.safetensors,"
            "Qwen/Qwen-Image:vae/diffusion_pytorch_model.safetensors"),
    trained="./models/train/Qwen-Image-EliGen-Poster_lora/epoch-4.safetensors",
    inputs=("eligen_entity_prompts", "eligen_entity_masks"),
    required=("eligen_entity_masks",),
    prompt="A beautiful girl wearing shirt and shorts in the street,  holding a sign 'Entity Control'",
    call=dict(height=1024, width=1024),
    output="Qwen-Image-EliGen-Poster.jpg",
    input_defaults={"eligen_entity_prompts": ["A beautiful girl", "sign 'Entity Control'", "shorts", "shirt"]},
)
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
