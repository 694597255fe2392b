"""LTX-2 text- and image-to-audio+video: the family's spec (data only; see ``pipelines.registry``)."""

from ..registry import FamilySpec, LoraTools, Release

_LTX23 = {"gated_attn": True, "audio_gated_attn": True, "cross_attn_mod": True, "audio_cross_attn_mod": True,
          "use_prompt_embeddings": False, "perturbed_attn": True, "rope_type": "split"}

SPEC = FamilySpec(
    name="ltx2",
    title="LTX-2",
    pipeline="diffsynth.pipelines.ltx2:LTX2AudioVideoPipeline",
    plan_name="ltx2",
    denoiser_class="LTX2VideoTransformer3DModel",
    video=True,
    model_ids=("Lightricks/LTX-2", "Lightricks/LTX-2.3", "jd-opensource/JoyAI-Echo"),
    # diffusers' defaults are the released LTX-2 19B transformer (Gemma-3 12B's 3840-wide prompt, 48 blocks); LTX-2.3
    # keeps its widths and depth and adds gated attention and the prompt's timestep modulation, its connectors
    # handing each stream prompt tokens of its own width (diffusers' conversion config of the release).
    releases=(
        Release("ltx2-19b", {}, ("Lightricks/LTX-2", "DiffSynth-Studio/LTX-2-Repackage")),
        # JoyAI-Echo is a fine-tune of LTX-2.3 (released as one file)
        Release("ltx2.3-22b", _LTX23, ("Lightricks/LTX-2.3*", "diffusers/LTX-2.3-*", "DiffSynth-Studio/LTX-2.3-*",
                                       "jd-opensource/JoyAI-Echo")),
    ),
    layouts=("diffusers", ("LTX-2 key names (LTX-2- and LTX-2.3-Repackage transformer, text_encoder_post_modules, VAE "
                           "halves, LTX-2 vocoder; single files such as JoyAI-Echo-release)")),
    original_readers=("diffsynth.pipelines.ltx2.original:identify",),
    # Gemma pads every prompt to 1024 tokens (the connectors keep the real ones, as registers fill the rest).
    prompt_tokens=1024,
    # Files name layers as LTX-2's own code (diffusion_model. + its names), which ComfyUI and diffusers' loader read.
    lora_tools=LoraTools("LTX2LoraLoaderMixin"),
    example_folder="examples/ltx2/model_training",
    # Its train.py's own flag (its --tokenizer_path and --initialize_model_on_cpu are Qwen-Image's too).
    reference_flags=("--frame_rate",),
    docs_page="LTX2.md",
)
