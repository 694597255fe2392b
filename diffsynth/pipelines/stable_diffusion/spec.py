"""Stable Diffusion 1.x and SDXL: the family's spec (data only; see ``pipelines.registry``). SDXL's pipeline,
``StableDiffusionXLPipeline``, lives in the same room (one denoiser class, one family); its scripts are under
``examples/stable_diffusion_xl/model_training``."""

from ..registry import FamilySpec, LoraTools

SPEC = FamilySpec(
    name="stable_diffusion",
    title="Stable Diffusion 1.5 / SDXL",
    pipeline="diffsynth.pipelines.stable_diffusion:StableDiffusionPipeline",
    plan_name="stable-diffusion",
    denoiser_class="UNet2DConditionModel",
    model_ids=("AI-ModelScope/stable-diffusion-v1-5", "stabilityai/stable-diffusion-xl-base-1.0"),
    # No release shapes for planning without files: a UNet has no block sequence to plan shallow copies of, so each
    # candidate plan dry-runs the whole UNet (about a minute per release on a CPU); the planner plans the files.
    # CLIP pads every prompt to its 77 positions.
    prompt_tokens=77,
    # SDXL's files load alike through StableDiffusionXLLoraLoaderMixin (the same kohya conversion).
    lora_tools=LoraTools("StableDiffusionLoraLoaderMixin"),
    # A UNet has no list of equal blocks: its down and up blocks differ in width and the mid block sits between them.
    block_swap=False,
    example_folder="examples/stable_diffusion/model_training",
    docs_page="Stable_Diffusion.md",
)
