"""Ideogram 4: the family's spec (data only; see ``pipelines.registry``)."""

from ..registry import FamilySpec, LoraTools, OriginalCheckpoint, Release

SPEC = FamilySpec(
    name="ideogram4",
    title="Ideogram 4",
    pipeline="diffsynth.pipelines.ideogram4:Ideogram4Pipeline",
    plan_name="ideogram4",
    denoiser_class="Ideogram4Transformer2DModel",
    model_ids=("ideogram-ai/ideogram-v4",),
    # diffusers' defaults are the released transformer (34 blocks, 4608 wide, 13 taps of Qwen3-VL-8B's 4096).
    releases=(Release("ideogram4", {}, ("ideogram-ai/ideogram-v4", "ideogram-ai/ideogram-4-*",
                                       "DiffSynth-Studio/ideogram-4-*")),),
    layouts=("Ideogram's own (bf16 repackage, fp8 with per-row scales)", "diffusers"),
    original_readers=("diffsynth.pipelines.ideogram4.original:identify",),
    original_checkpoint=OriginalCheckpoint("diffsynth.pipelines.ideogram4.original:transformer_to_original"),
    # A JSON caption runs to several hundred tokens.
    prompt_tokens=512,
    # Files keep diffusers' names (naming.py); diffusers' Ideogram4LoraLoaderMixin loads their transformer. twin.
    lora_tools=LoraTools("Ideogram4LoraLoaderMixin"),
    # The reader (original.py) takes the bf16 repackage and the fp8 release; NF4's bitsandbytes packing it does not.
    refused_model_ids={
        "ideogram-ai/ideogram-4-nf4": ("Ideogram 4's NF4 release packs its weights in bitsandbytes' 4-bit layout, "
                                       "which no reader here dequantizes yet; use DiffSynth-Studio/ideogram-4-bf16-"
                                       "repackage or ideogram-ai/ideogram-4-fp8 (and --quant_options "
                                       "<model>:bitsandbytes_nf4 for memory)"),
    },
    example_folder="examples/ideogram4/model_training",
    docs_page="Ideogram4.md",
)
