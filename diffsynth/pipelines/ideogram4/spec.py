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
    layouts=("Ideogram's own (bf16 repackage, fp8 with per-row scales, bitsandbytes NF4)", "diffusers"),
    original_readers=("diffsynth.pipelines.ideogram4.original:identify",),
    original_checkpoint=OriginalCheckpoint("diffsynth.pipelines.ideogram4.original:transformer_to_original"),
    # A JSON caption runs to several hundred tokens.
    prompt_tokens=512,
    # Files keep diffusers' names (naming.py); diffusers' Ideogram4LoraLoaderMixin loads their transformer. twin.
    lora_tools=LoraTools("Ideogram4LoraLoaderMixin"),
    # The reader (original.py) takes the bf16 repackage, the fp8 release and the NF4 release (kept 4-bit).
    bitsandbytes_model_ids=("ideogram-ai/ideogram-4-nf4",),
    example_folder="examples/ideogram4/model_training",
    docs_page="Ideogram4.md",
)
