"""Renders one image with Ideogram-4-bf16-repackage and a trained LoRA merged into its transformer, to see what it
learned (``diffsynth.training.validate``: the flags, their checks and the steps).

    python examples/ideogram4/model_training/validate_lora/Ideogram-4-bf16-repackage.py \
        --lora_path ./models/train/Ideogram-4-bf16-repackage_lora/epoch-4.safetensors

``--lora_alpha_scale 0`` renders the base model from the same seed; ``--before_after`` renders both from one load. The
models load as ``lora/Ideogram-4-bf16-repackage.sh`` trains on them; the defaults are the reference script's.
"""

from __future__ import annotations

from diffsynth.training.validate import ImageScript

# The reference's structured caption (Ideogram 4 was trained on JSON captions).
PROMPT = ("{\"high_level_description\":\"A close-up photograph of a happy Pembroke Welsh Corgi sitting"
          " on a concrete wall, panting with its tongue out, set against a backdrop of blurred pink"
          " cherry blossoms and blue sky.\",\"style_description\":{\"aesthetics\":\"joyful, vibrant, spri"
          "ng-like, cute, energetic\",\"lighting\":\"bright natural daylight, soft diffuse sunlight, sh"
          "allow depth of field\",\"photo\":\"85mm lens, f/2.0, bokeh background, sharp focus on dog fa"
          "ce\",\"medium\":\"photograph\",\"color_palette\":[\"#E2725B\",\"#FFFFFF\",\"#FFB7C5\",\"#87CEEB\",\"#A9A"
          "9A9\"]},\"compositional_deconstruction\":{\"background\":\"Softly blurred background of pink c"
          "herry blossom branches against a pale blue sky. The bokeh effect creates a dreamy spring"
          " atmosphere. The background is out of focus to highlight the sharp details of the dog in"
          " the foreground.\",\"elements\":[{\"type\":\"obj\",\"bbox\":[150,200,900,850],\"desc\":\"A Pembroke "
          "Welsh Corgi with fluffy orange and white fur. Its mouth is open, panting with a pink ton"
          "gue hanging out, expression is happy and excited. Ears are perked up. Sharp focus on the"
          " face and eyes.\"},{\"type\":\"obj\",\"bbox\":[850,0,1000,1000],\"desc\":\"A grey concrete wall or"
          " ledge at the bottom of the frame. The dog's front paws are resting near the edge. Rough"
          " texture.\"}]}}")
SCRIPT = ImageScript(
    name="Ideogram-4-bf16-repackage",
    pipeline="diffsynth.pipelines.ideogram4:Ideogram4Pipeline",
    models=("DiffSynth-Studio/ideogram-4-bf16-repackage:transformer/diffusion_pytorch_model.safetensors,"
            "DiffSynth-Studio/ideogram-4-bf16-repackage:text_encoder/model.safetensors,"
            "DiffSynth-Studio/ideogram-4-bf16-repackage:vae/diffusion_pytorch_model.safetensors"),
    trained="./models/train/Ideogram-4-bf16-repackage_lora/epoch-4.safetensors",
    slots=("dit", "dit_uncond"),
    prompt=PROMPT,
    call=dict(height=1024, width=1024, num_inference_steps=48, cfg_scale=7.0),
    output="image_lora.jpg",
)
MODEL_ID_WITH_ORIGIN_PATHS = SCRIPT.models
main = SCRIPT.main  # main(argv) renders the image and returns the file written

if __name__ == "__main__":
    main()
