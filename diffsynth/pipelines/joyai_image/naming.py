"""JoyAI-Image-Edit's layer names for LoRA files: the JoyAI code's (``transformer.pth``; the reference's
``JoyAIImageDiT``), which name a block's attention layers without diffusers' ``attn.`` (``original.py``)."""

from ...diffusion.module_naming import ModuleNaming

_STREAM_LAYERS = ("attn_qkv", "attn_proj")
_BLOCK_LINEARS = ("img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2")
_TOP_LINEARS = (
    "condition_embedder.time_embedder.linear_1", "condition_embedder.time_embedder.linear_2",
    "condition_embedder.time_proj", "condition_embedder.text_embedder.linear_1",
    "condition_embedder.text_embedder.linear_2", "proj_out",
)  # fmt: skip

NAMING = ModuleNaming(
    "JoyAI-Image",
    block_layers={
        **{f"attn.{stream}_{layer}": f"{stream}_{layer}" for stream in ("img", "txt") for layer in _STREAM_LAYERS},
        **{layer: layer for layer in _BLOCK_LINEARS},
    },
    top_layers={layer: layer for layer in _TOP_LINEARS},
    block_list="double_blocks",
)
