"""FLUX.2 [klein] 4B and 9B (and their -base models) and FLUX.2 [dev]: the family's spec (data only; see
``pipelines.registry``).

[dev] shares this room with [klein]: one pipeline runs both, as the reference's one ``train.py`` trains both, and its
denoiser is the same diffusers class (the registry maps a class to one family, for LoRA naming, fp8 and the planner);
only its text encoder (Mistral-3, ``prompt.py``) and its guidance embedding differ.
"""

from ..registry import FamilySpec, LoraTools, Release

SPEC = FamilySpec(
    name="flux2_klein",
    title="FLUX.2 [klein] and [dev]",
    pipeline="diffsynth.pipelines.flux2_klein:Flux2KleinPipeline",
    plan_name="flux2-klein",
    denoiser_class="Flux2Transformer2DModel",
    model_ids=("black-forest-labs/FLUX.2-klein-4B", "black-forest-labs/FLUX.2-klein-9B",
               "black-forest-labs/FLUX.2-klein-base-4B", "black-forest-labs/FLUX.2-klein-base-9B",
               "black-forest-labs/FLUX.2-dev"),
    releases=(
        Release("flux.2-klein-4b", dict(guidance_embeds=False, joint_attention_dim=7680, num_attention_heads=24,
                                        num_layers=5, num_single_layers=20),
                ("black-forest-labs/FLUX.2-klein-4B", "black-forest-labs/FLUX.2-klein-base-4B")),
        Release("flux.2-klein-9b", dict(guidance_embeds=False, joint_attention_dim=12288, num_attention_heads=32,
                                        num_layers=8, num_single_layers=24),
                ("black-forest-labs/FLUX.2-klein-9B", "black-forest-labs/FLUX.2-klein-base-9B")),
        # diffusers' defaults are the dev transformer (32B: 8 double-stream and 48 single-stream blocks, guidance).
        Release("flux.2-dev", {}, ("black-forest-labs/FLUX.2-dev",)),
    ),
    # Qwen3 and Mistral-3 pad every prompt to 512 tokens.
    prompt_tokens=512,
    # The released scheduler config's line; inference passes its own (empirical) mu and training bends the grid at
    # training_mu 0.8, as the reference trainer does.
    scheduler_presets={"flux2": dict(dynamic_shift=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                                     max_image_seq_len=4096)},
    # ComfyUI reads FLUX.2 files through its map onto BFL's layout, with diffusers' names bare.
    lora_tools=LoraTools("Flux2LoraLoaderMixin", comfyui_key_map="bfl"),
    refused_model_ids={
        "DiffSynth-Studio/Template-KleinBase4B": "the FLUX.2 [klein] template models (Template-KleinBase4B-*) are not "
                                                 "supported here",
        "DiffSynth-Studio/KleinBase4B-i2L": "FLUX.2 [klein] image-to-LoRA (i2L) template models are not supported "
                                            "here",
    },
    example_folder="examples/flux2/model_training",
    docs_page="FLUX2.md",
)
