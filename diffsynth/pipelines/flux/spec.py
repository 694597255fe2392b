"""FLUX.1 [dev], Krea [dev] and Kontext [dev]: the family's spec (data only; see ``pipelines.registry``)."""

from ..registry import FamilySpec, LoraTools, OriginalCheckpoint, Release

_CONTROLNETS = "the FLUX.1 ControlNets are not supported here"

SPEC = FamilySpec(
    name="flux",
    title="FLUX.1",
    pipeline="diffsynth.pipelines.flux:FluxPipeline",
    plan_name="flux",
    denoiser_class="FluxTransformer2DModel",
    model_ids=("black-forest-labs/FLUX.1-dev", "black-forest-labs/FLUX.1-Krea-dev",
               "black-forest-labs/FLUX.1-Kontext-dev"),
    # diffusers' defaults are FLUX.1's transformer but for the guidance embedding of the distilled releases.
    releases=(Release("flux.1-dev", dict(guidance_embeds=True), (
        "black-forest-labs/FLUX.1-dev", "black-forest-labs/FLUX.1-Krea-dev", "black-forest-labs/FLUX.1-Kontext-dev")),),
    layouts=("diffusers", "BFL single files (flux1-*.safetensors, ae.safetensors)"),
    original_readers=("diffsynth.pipelines.flux.original:identify",),
    original_checkpoint=OriginalCheckpoint("diffsynth.pipelines.flux.original:transformer_to_original"),
    # T5 pads every prompt to 512 tokens.
    prompt_tokens=512,
    scheduler_presets={"flux": dict(dynamic_shift=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                                    max_image_seq_len=4096, training_shift=3.0)},
    lora_tools=LoraTools("FluxLoraLoaderMixin", comfyui_key_map="bfl", diffsynth_studio_loader="bfl"),
    # EliGen runs on Qwen-Image here; its FLUX.1 command loads only FLUX.1-dev's own models.
    refused_inputs=dict.fromkeys(["eligen_entity_masks", "eligen_entity_prompts"],
                                 "FLUX.1's EliGen (entity-level regional prompts) is not supported here; EliGen runs "
                                 "on Qwen-Image"),
    refused_model_ids={
        "black-forest-labs/FLUX.1-Fill-dev": "FLUX.1 Fill (inpainting and outpainting; also Insert-Anything, which "
                                             "builds on it) is not supported here; train FLUX.1-dev, -Krea-dev or "
                                             "-Kontext-dev",
        "black-forest-labs/FLUX.1-Redux-dev": "FLUX.1 Redux (image-prompt adapter) is not supported here",
        "ostris/Flex.2-preview": "Flex.2 (ostris' FLUX.1 derivative with inpainting and control inputs) is not "
                                "supported here",
        "InstantX/FLUX.1-dev-Controlnet-": _CONTROLNETS,
        "alimama-creative/FLUX.1-dev-Controlnet-": _CONTROLNETS,
        "jasperai/Flux.1-dev-Controlnet-": _CONTROLNETS,
        "InstantX/FLUX.1-dev-IP-Adapter": "the FLUX.1 IP-Adapter is not supported here",
        "ByteDance/InfiniteYou": "InfiniteYou (FLUX.1 identity ControlNet) is not supported here",
        "DiffSynth-Studio/AttriCtrl-FLUX.1-Dev": "AttriCtrl (FLUX.1 attribute value control) is not supported here",
        "DiffSynth-Studio/LoRA-Encoder-FLUX.1-Dev": "the FLUX.1 LoRA-Encoder is not supported here",
        "DiffSynth-Studio/Nexus-Gen": "Nexus-Gen (Qwen2.5-VL with a FLUX.1 decoder) is not supported here",
    },
    reference_flags=("--tokenizer_1_path", "--tokenizer_2_path", "--align_to_opensource_format"),
    example_folder="examples/flux/model_training",
    docs_page="FLUX.md",
)
