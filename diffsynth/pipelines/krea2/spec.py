"""Krea 2 (Krea-2-Raw and Krea-2-Turbo): the family's spec (data only; see ``pipelines.registry``)."""

from ..registry import FamilySpec, LoraTools, OriginalCheckpoint, Release

SPEC = FamilySpec(
    name="krea2",
    title="Krea 2",
    pipeline="diffsynth.pipelines.krea2:Krea2Pipeline",
    plan_name="krea2",
    denoiser_class="Krea2Transformer2DModel",
    model_ids=("krea/Krea-2-Raw", "krea/Krea-2-Turbo"),
    # diffusers' defaults are the released transformer (28 blocks, 6144 wide, 12 taps of Qwen3-VL-4B).
    releases=(Release("krea2", {}, ("krea/Krea-2-Raw", "krea/Krea-2-Turbo")),),
    layouts=("Krea single files (raw.safetensors, turbo.safetensors)", "diffusers"),
    original_readers=("diffsynth.pipelines.krea2.original:identify",),
    original_checkpoint=OriginalCheckpoint("diffsynth.pipelines.krea2.original:transformer_to_original"),
    # Every prompt is padded to 512 tokens.
    prompt_tokens=512,
    scheduler_presets={"krea2": dict(dynamic_shift=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                                     max_image_seq_len=6400, training_mu=0.8)},
    # Files name Krea's own modules under diffusion_model., which diffusers' Krea 2 loader converts; DiffSynth-Studio's
    # Krea2LoRALoader also renames diffusers' names under transformer. (the reference's aligned files).
    lora_tools=LoraTools("Krea2LoraLoaderMixin", diffsynth_studio_loader="native_or_diffusers"),
    reference_flags=("--align_to_opensource_format",),
    example_folder="examples/krea2/model_training",
    docs_page="Krea2.md",
)
