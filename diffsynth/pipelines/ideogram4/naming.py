"""Ideogram 4's layer names for LoRA files: Ideogram's own module tree (DiffSynth-Studio's ``Ideogram4DiT``, the
release layout of ``original.py``), whose attention holds one fused ``attention.qkv`` and names ``to_out.0``
``attention.o``; every other layer keeps diffusers' name.

Universal and kohya files name those layers (``diffusion_model.layers.0.attention.qkv.lora_A.weight``), as
DiffSynth-Studio and diffusers' ``_convert_non_diffusers_ideogram4_lora_to_diffusers`` read them: the LoRAs of
``to_q``, ``to_k``, ``to_v`` become one LoRA of the fused layer with the same update (``lora.formats.fuse_layers``).
The ``.diffusers.safetensors`` twin keeps diffusers' names under ``transformer.``, which diffusers'
``Ideogram4LoraLoaderMixin`` loads as it is.
"""

from ...diffusion.module_naming import FusedLayer, FusedNaming, ModuleNaming

_BLOCK = "layers.{}."
# Layers whose name is the same in both trees (the block's, then those outside the blocks).
_SAME = (*(_BLOCK + name for name in ("feed_forward.w1", "feed_forward.w2", "feed_forward.w3", "adaln_modulation")),
         "input_proj", "llm_cond_proj", "t_embedding.mlp_in", "t_embedding.mlp_out", "adaln_proj",
         "final_layer.linear", "final_layer.adaln_modulation")

IDEOGRAM_NAMING = FusedNaming("Ideogram 4", {
    _BLOCK + "attention.qkv": FusedLayer(tuple(_BLOCK + f"attention.to_{part}" for part in "qkv"), (1, 1, 1)),
    _BLOCK + "attention.o": FusedLayer((_BLOCK + "attention.to_out.0",)),
    **{name: FusedLayer((name,)) for name in _SAME},
})

NAMING = ModuleNaming("Ideogram 4", identity=True, fused=IDEOGRAM_NAMING, fused_layouts=("kohya", "universal"))
