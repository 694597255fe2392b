"""ERNIE-Image and ERNIE-Image-Turbo: the family's spec (data only; see ``pipelines.registry``)."""

from ..registry import FamilySpec, LoraTools, Release

SPEC = FamilySpec(
    name="ernie_image",
    title="ERNIE-Image",
    pipeline="diffsynth.pipelines.ernie_image:ErnieImagePipeline",
    plan_name="ernie-image",
    denoiser_class="ErnieImageTransformer2DModel",
    model_ids=("PaddlePaddle/ERNIE-Image", "PaddlePaddle/ERNIE-Image-Turbo"),
    # diffusers' defaults are the released transformer (24 blocks, 3072 wide, Ministral-3B's 3072-wide states).
    releases=(Release("ernie-image", {"text_in_dim": 3072},
                      ("PaddlePaddle/ERNIE-Image", "PaddlePaddle/ERNIE-Image-Turbo")),),
    # A prompt keeps its own tokens; 256 is a long caption.
    prompt_tokens=256,
    scheduler_presets={"ernie_image": dict(shift=3.0)},
    # The released files and the reference's DiT use diffusers' names; diffusers' loader takes them under
    # diffusion_model.
    lora_tools=LoraTools("ErnieImageLoraLoaderMixin"),
    example_folder="examples/ernie_image/model_training",
    docs_page="ERNIE_Image.md",
)
