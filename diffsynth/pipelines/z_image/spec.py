"""Z-Image, Z-Image-Turbo and Z-Image-Omni-Base: the family's spec (data only; see ``pipelines.registry``)."""

from ..registry import FamilySpec, LoraTools, Release

SPEC = FamilySpec(
    name="z_image",
    title="Z-Image",
    pipeline="diffsynth.pipelines.z_image:ZImagePipeline",
    plan_name="z-image",
    denoiser_class="ZImageTransformer2DModel",
    model_ids=("Tongyi-MAI/Z-Image", "Tongyi-MAI/Z-Image-Turbo", "Tongyi-MAI/Z-Image-Omni-Base",
               "PAI/Z-Image-Turbo-Fun-Controlnet-Union-2.1"),
    # diffusers' defaults are the released Z-Image (and Z-Image-Turbo) transformer. Z-Image-Omni-Base is not among the
    # releases: its transformer takes SigLIP features, which the planner's inputs do not give.
    layouts=("diffusers", "PAI Fun ControlNet single files (Union, Union 8-step, Tile)"),
    releases=(Release("z-image", {}, ("Tongyi-MAI/Z-Image", "Tongyi-MAI/Z-Image-Turbo")),),
    # A prompt keeps its own tokens; 256 is a long caption.
    prompt_tokens=256,
    scheduler_presets={"z_image": dict(shift=3.0)},
    # The released transformers use diffusers' names; ComfyUI reads them through its Lumina2 key map.
    lora_tools=LoraTools("ZImageLoraLoaderMixin", comfyui_key_map="lumina2"),
    # Its TimestepEmbedder casts the sinusoidal embedding to mlp[0].weight.dtype.
    fp8_input_casting_layers=("t_embedder",),
    # The Fun ControlNets ship as single files under diffusers' names, without a config.
    original_readers=("diffsynth.pipelines.z_image.original:identify",),
    refused_model_ids={
        "DiffSynth-Studio/ZImage-i2L": "Z-Image image-to-LoRA (i2L) template models are not supported here",
    },
    reference_flags=("--enable_npu_patch",),
    example_folder="examples/z_image/model_training",
    docs_page="Z_Image.md",
)
