"""JoyAI-Image-Edit: the family's spec (data only; see ``pipelines.registry``)."""

from ..registry import FamilySpec, LoraTools, Release

SPEC = FamilySpec(
    name="joyai_image",
    title="JoyAI-Image-Edit",
    pipeline="diffsynth.pipelines.joyai_image:JoyAIImagePipeline",
    plan_name="joyai-image",
    denoiser_class="JoyImageEditTransformer3DModel",
    model_ids=("jd-opensource/JoyAI-Image-Edit",),
    # The released transformer: 40 double-stream blocks, 4096 wide (32 heads of 128), Qwen3-VL-8B's 4096-wide states.
    releases=(Release("joyai-image-edit", {"hidden_size": 4096, "num_attention_heads": 32, "text_dim": 4096,
                                           "num_layers": 40}, ("jd-opensource/JoyAI-Image-Edit",)),),
    layouts=("JoyAI transformer.pth, Qwen3-VL folder (JoyAI-Image-Und), Wan2.1_VAE.pth", "diffusers"),
    original_readers=("diffsynth.pipelines.joyai_image.original:identify",),
    # An edit prompt holds the edit image's vision tokens besides its words.
    prompt_tokens=1024,
    scheduler_presets={"joyai_image": dict(shift=4.0)},
    # diffusers 0.42 loads no LoRA into JoyImageEditTransformer3DModel (no loader mixin, no PeftAdapterMixin); the
    # .diffusers.safetensors twins hold its names, which a plain transformer loader (Sana's) reads for the checks.
    lora_tools=LoraTools("SanaLoraLoaderMixin"),
    example_folder="examples/joyai_image/model_training",
    docs_page="JoyAI_Image.md",
)
