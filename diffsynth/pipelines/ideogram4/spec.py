"""Ideogram 4: the family's spec (data only; see ``pipelines.registry``)."""

from ..registry import FamilySpec, LoraTools, Release

_NO_READER = ("Ideogram 4's {} release keeps Ideogram's own layout (fused attention.qkv{}), which no reader here takes "
              "yet; use a diffusers-layout Ideogram 4 folder")

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
    layouts=("diffusers",),
    # A JSON caption runs to several hundred tokens.
    prompt_tokens=512,
    # Files keep diffusers' names (naming.py); diffusers' Ideogram4LoraLoaderMixin loads their transformer. twin.
    lora_tools=LoraTools("Ideogram4LoraLoaderMixin"),
    refused_model_ids={
        "DiffSynth-Studio/ideogram-4-bf16-repackage": _NO_READER.format("bf16 repackage", ""),
        "ideogram-ai/ideogram-4-fp8": _NO_READER.format("fp8", ", fp8 weights with their scales"),
        "ideogram-ai/ideogram-4-nf4": _NO_READER.format("NF4", ", NF4-quantized weights"),
    },
    example_folder="examples/ideogram4/model_training",
    docs_page="Ideogram4.md",
)
