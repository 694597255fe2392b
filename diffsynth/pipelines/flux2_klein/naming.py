"""FLUX.2's layer names for LoRA files ([klein] and [dev] alike).

DiffSynth-Studio's Flux2DiT keeps diffusers' module names. ComfyUI runs BFL's fused layout, and its Flux key map
(comfy/lora.py with comfy/utils.flux_to_diffusers) takes diffusers names bare or under transformer., landing
to_q/to_k/to_v on slices of the fused qkv, but never under diffusion_model.: so the names are written bare.

That map has no diffusers name for FLUX.2's shared modulations and its time / guidance embedders, and none of the
``lora_unet_`` names of diffusers' layers: kohya files therefore name BFL's layers, the names of the released
``flux2-dev.safetensors`` (and of the single-file [klein] releases), which ComfyUI reads for every layer as its own
module names (``lora_unet_double_blocks_0_img_attn_qkv``, ``lora_unet_double_stream_modulation_img_lin``).
"""

from ...diffusion.module_naming import FusedLayer, FusedNaming, ModuleNaming

_DOUBLE, _SINGLE = "double_blocks.{}.", "transformer_blocks.{}."
# BFL name -> the diffusers layer it is, for the layers of one part (diffusers' single-file converter's renames).
_ONE_PART = {
    "img_in": "x_embedder", "txt_in": "context_embedder",
    "time_in.in_layer": "time_guidance_embed.timestep_embedder.linear_1",
    "time_in.out_layer": "time_guidance_embed.timestep_embedder.linear_2",
    "guidance_in.in_layer": "time_guidance_embed.guidance_embedder.linear_1",
    "guidance_in.out_layer": "time_guidance_embed.guidance_embedder.linear_2",
    "double_stream_modulation_img.lin": "double_stream_modulation_img.linear",
    "double_stream_modulation_txt.lin": "double_stream_modulation_txt.linear",
    "single_stream_modulation.lin": "single_stream_modulation.linear",
    "final_layer.linear": "proj_out",
    **{_DOUBLE + bfl: _SINGLE + name for bfl, name in (
        ("img_attn.proj", "attn.to_out.0"), ("txt_attn.proj", "attn.to_add_out"),
        ("img_mlp.0", "ff.linear_in"), ("img_mlp.2", "ff.linear_out"),
        ("txt_mlp.0", "ff_context.linear_in"), ("txt_mlp.2", "ff_context.linear_out"))},
    "single_blocks.{}.linear1": "single_transformer_blocks.{}.attn.to_qkv_mlp_proj",
    "single_blocks.{}.linear2": "single_transformer_blocks.{}.attn.to_out",
}  # fmt: skip

BFL_NAMING = FusedNaming("BFL FLUX.2", {
    _DOUBLE + "img_attn.qkv": FusedLayer(tuple(_SINGLE + f"attn.to_{part}" for part in "qkv"), (1, 1, 1)),
    _DOUBLE + "txt_attn.qkv": FusedLayer(tuple(_SINGLE + f"attn.add_{part}_proj" for part in "qkv"), (1, 1, 1)),
    # BFL's final modulation yields shift then scale, diffusers' norm_out scale then shift.
    "final_layer.adaLN_modulation.1": FusedLayer(("norm_out.linear",), swapped_halves=True),
    **{bfl: FusedLayer((name,)) for bfl, name in _ONE_PART.items()},
})

NAMING = ModuleNaming("DiffSynth-Studio FLUX.2", identity=True, universal_prefix="", fused=BFL_NAMING)
