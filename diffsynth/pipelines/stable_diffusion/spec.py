"""Stable Diffusion 1.x: the family's spec (data only; see ``pipelines.registry``)."""

from ..registry import FamilySpec, LoraTools, Release

SPEC = FamilySpec(
    name="stable_diffusion",
    title="Stable Diffusion 1.5",
    pipeline="diffsynth.pipelines.stable_diffusion:StableDiffusionPipeline",
    plan_name="stable-diffusion",
    denoiser_class="UNet2DConditionModel",
    model_ids=("AI-ModelScope/stable-diffusion-v1-5",),
    # diffusers' UNet2DConditionModel defaults are SD 1.x's UNet but for the cross-attention width and head size.
    releases=(Release("stable-diffusion-v1-5", {"cross_attention_dim": 768, "attention_head_dim": 8},
                      ("AI-ModelScope/stable-diffusion-v1-5", "*stable-diffusion-v1-5")),),
    # CLIP pads every prompt to its 77 positions.
    prompt_tokens=77,
    lora_tools=LoraTools("StableDiffusionLoraLoaderMixin"),
    # A UNet has no list of equal blocks: its down and up blocks differ in width and the mid block sits between them.
    block_swap=False,
    example_folder="examples/stable_diffusion/model_training",
    docs_page="Stable_Diffusion.md",
)
