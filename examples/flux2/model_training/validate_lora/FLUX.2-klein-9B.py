"""Renders one image with FLUX.2-klein-9B and a trained LoRA merged into its transformer, to see what it learned
(``diffsynth.training.validate``: the flags, their checks and the steps).

    python examples/flux2/model_training/validate_lora/FLUX.2-klein-9B.py \
        --lora_path ./models/train/FLUX.2-klein-9B_lora/epoch-4.safetensors

``--lora_alpha_scale 0`` renders the base model from the same seed; ``--before_after`` renders both from one load. The
models load as ``lora/FLUX.2-klein-9B.sh`` trains on them; the defaults are the reference script's.
"""

from __future__ import annotations

from diffsynth.training.validate import ImageScript

SCRIPT = ImageScript(
    name="FLUX.2-klein-9B",
    pipeline="diffsynth.pipelines.flux2_klein:Flux2KleinPipeline",
    models=("black-forest-labs/FLUX.2-klein-9B:text_encoder/*.safetensors,"
            "black-forest-labs/FLUX.2-klein-9B:transformer/*.safetensors,"
            "black-forest-labs/FLUX.2-klein-9B:vae/diffusion_pytorch_model.safetensors"),
    trained="./models/train/FLUX.2-klein-9B_lora/epoch-4.safetensors",
    tokenizer="black-forest-labs/FLUX.2-klein-9B:tokenizer/",
    call=dict(num_inference_steps=40, cfg_scale=4.0, height=768, width=768),
)
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
