"""Qwen-Image, Qwen-Image-Edit (-2509, -2511) and the releases on their architecture (FireRed-Image-Edit,
Qwen-Image-Distill-Full), Qwen-Image-Layered and Layered-Control (with the In-Context-Control LoRAs' context_image): the
family's spec (data only; see ``pipelines.registry``)."""

from ..registry import FamilySpec, LoraTools, Release

SPEC = FamilySpec(
    name="qwen_image",
    title="Qwen-Image",
    pipeline="diffsynth.pipelines.qwen_image:QwenImagePipeline",
    plan_name="qwen-image",
    denoiser_class="QwenImageTransformer2DModel",
    model_ids=("Qwen/Qwen-Image", "Qwen/Qwen-Image-Edit", "Qwen/Qwen-Image-Edit-2509", "Qwen/Qwen-Image-Edit-2511",
               "FireRedTeam/FireRed-Image-Edit-1.0", "FireRedTeam/FireRed-Image-Edit-1.1",
               "DiffSynth-Studio/Qwen-Image-Distill-Full", "Qwen/Qwen-Image-Layered",
               "DiffSynth-Studio/Qwen-Image-Layered-Control"),
    releases=(Release("qwen-image", dict(
        patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128, num_attention_heads=24,
        joint_attention_dim=3584, guidance_embeds=False, axes_dims_rope=(16, 56, 56)),
        ("Qwen/Qwen-Image*", "FireRedTeam/FireRed-Image-Edit-*", "DiffSynth-Studio/Qwen-Image-Distill-Full",
         "DiffSynth-Studio/Qwen-Image-Layered-Control")),),
    # A prompt keeps its own tokens; 256 is a long caption.
    prompt_tokens=256,
    scheduler_presets={"qwen_image": dict(dynamic_shift=True, base_shift=0.5, max_shift=0.9, base_image_seq_len=256,
                                          max_image_seq_len=8192, shift_terminal=0.02)},
    # The original release uses diffusers' names.
    lora_tools=LoraTools("QwenImageLoraLoaderMixin", comfyui_key_map="native_bare"),
    refused_model_ids={
        "DiffSynth-Studio/Qwen-Image-Blockwise-ControlNet-": "the Qwen-Image Blockwise ControlNets are not supported "
                                                             "here",
    },
    reference_flags=("--tokenizer_path", "--processor_path", "--zero_cond_t", "--initialize_model_on_cpu"),
    example_folder="examples/qwen_image/model_training",
    docs_page="Qwen_Image.md",
)
