"""LTX-2's own layer names for LoRA files (``diffusion_model.`` + the names of Lightricks' LTX-2 code, which ComfyUI
runs and diffusers' ``LTX2LoraLoaderMixin`` converts back).

The blocks keep their names (``transformer_blocks.<i>.attn1.to_q``, ``audio_ff.net.0.proj``); diffusers renamed only
layers outside them, as its LoRA converter (``_convert_non_diffusers_ltx2_lora_to_diffusers``) undoes: the input
projections and the AdaLN timestep embedders.
"""

from ...diffusion.module_naming import ModuleNaming

# diffusers' name -> the original one, for each AdaLN embedder module (its three Linear layers follow).
_EMBEDDERS = {
    "time_embed": "adaln_single", "audio_time_embed": "audio_adaln_single",
    "av_cross_attn_video_scale_shift": "av_ca_video_scale_shift_adaln_single",
    "av_cross_attn_video_a2v_gate": "av_ca_a2v_gate_adaln_single",
    "av_cross_attn_audio_scale_shift": "av_ca_audio_scale_shift_adaln_single",
    "av_cross_attn_audio_v2a_gate": "av_ca_v2a_gate_adaln_single",
    # LTX-2.3's prompt modulation.
    "prompt_adaln": "prompt_adaln_single", "audio_prompt_adaln": "audio_prompt_adaln_single",
}  # fmt: skip
_EMBEDDER_LAYERS = ("emb.timestep_embedder.linear_1", "emb.timestep_embedder.linear_2", "linear")
_KEPT_TOP = ("proj_out", "audio_proj_out", "caption_projection.linear_1", "caption_projection.linear_2",
             "audio_caption_projection.linear_1", "audio_caption_projection.linear_2")
_ATTENTIONS = ("attn1", "attn2", "audio_attn1", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn")
_BLOCK_LAYERS = (*(f"{attention}.{layer}" for attention in _ATTENTIONS
                   for layer in ("to_q", "to_k", "to_v", "to_out.0", "to_gate_logits")),
                 "ff.net.0.proj", "ff.net.2", "audio_ff.net.0.proj", "audio_ff.net.2")

NAMING = ModuleNaming(
    "LTX-2",
    block_layers={layer: layer for layer in _BLOCK_LAYERS},
    top_layers={
        "proj_in": "patchify_proj", "audio_proj_in": "audio_patchify_proj", **{layer: layer for layer in _KEPT_TOP},
        **{f"{name}.{layer}": f"{native}.{layer}" for name, native in _EMBEDDERS.items() for layer in _EMBEDDER_LAYERS},
    },
    block_list="transformer_blocks",
)  # fmt: skip
