"""The original Wan encoder files as transformers models: UMT5 text encoder and CLIP vision tower.

``models_t5_umt5-xxl-enc-bf16.pth`` holds the encoder of ``wan/modules/t5.py`` (``T5Encoder`` with a relative position
table in every block); it is ``UMT5EncoderModel`` under other names. ``models_clip_open-clip-xlm-roberta-large-vit-
huge-14.pth`` holds ``XLMRobertaCLIP`` of ``wan/modules/clip.py``; Wan's image-to-video models read only its vision
tower (the hidden states before the last block), which is ``CLIPVisionModel`` with the query, key and value
projections fused into one ``to_qkv`` matrix. The text tower (``textual.*``), the logit scale and the projection head
are not loaded: no Wan pipeline uses them.

Name maps (original -> transformers), one block shown:

========================================================  =========================================================
``token_embedding``                                       ``shared`` (tied to ``encoder.embed_tokens``)
``blocks.I.norm1`` / ``.norm2``                            ``encoder.block.I.layer.0.layer_norm`` / ``.layer.1...``
``blocks.I.attn.{q,k,v,o}``                               ``encoder.block.I.layer.0.SelfAttention.{q,k,v,o}``
``blocks.I.pos_embedding.embedding``                      ``encoder.block.I.layer.0.SelfAttention.relative_atten-
                                                          tion_bias``
``blocks.I.ffn.gate.0`` / ``.fc1`` / ``.fc2``              ``encoder.block.I.layer.1.DenseReluDense.wi_0 / wi_1 /
                                                          wo``
``norm``                                                  ``encoder.final_layer_norm``
``visual.patch_embedding`` / ``.pre_norm`` / ``.post_norm``  ``embeddings.patch_embedding`` / ``pre_layrnorm`` /
                                                          ``post_layernorm``
``visual.cls_embedding`` (1, 1, D) / ``.pos_embedding``   ``embeddings.class_embedding`` (D) / ``embeddings.positi-
(1, N, D)                                                 on_embedding.weight`` (N, D)
``visual.transformer.I.attn.to_qkv`` (3D, D)              ``encoder.layers.I.self_attn.{q,k,v}_proj`` (D, D) each
``visual.transformer.I.attn.proj`` / ``.norm1`` /         ``encoder.layers.I.self_attn.out_proj`` / ``layer_norm1``
``.norm2`` / ``.mlp.0`` / ``.mlp.2``                      / ``layer_norm2`` / ``mlp.fc1`` / ``mlp.fc2``
========================================================  =========================================================

Widths, depths and vocabulary come from the tensor shapes. What the files do not record is fixed by the release code:
UMT5's relative positions saturate at 128 (``T5RelativeEmbedding(max_dist=128)``) and use the tanh GELU
(``gated-gelu``), the CLIP tower has 16 heads (``clip_xlm_roberta_vit_h_14``), exact GELU and LayerNorm eps 1e-5.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import torch

from ...core.loader.errors import ModelLoadError

UMT5_MAX_DISTANCE = 128
CLIP_NUM_HEADS = 16
CLIP_LAYER_NORM_EPS = 1e-5

# image_processor/preprocessor_config.json of Wan-AI/Wan2.1-I2V-14B-480P-Diffusers (OpenAI CLIP preprocessing at the
# tower's image size); the original layout ships no processor, so it is built from these values.
CLIP_IMAGE_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_IMAGE_STD = [0.26862954, 0.26130258, 0.27577711]

_UMT5_BLOCK_NAMES = {
    "norm1": "layer.0.layer_norm",
    "attn.q": "layer.0.SelfAttention.q", "attn.k": "layer.0.SelfAttention.k",
    "attn.v": "layer.0.SelfAttention.v", "attn.o": "layer.0.SelfAttention.o",
    "pos_embedding.embedding": "layer.0.SelfAttention.relative_attention_bias",
    "norm2": "layer.1.layer_norm",
    "ffn.gate.0": "layer.1.DenseReluDense.wi_0", "ffn.fc1": "layer.1.DenseReluDense.wi_1",
    "ffn.fc2": "layer.1.DenseReluDense.wo",
}  # fmt: skip
_UMT5_TOP_NAMES = {"token_embedding": "shared", "norm": "encoder.final_layer_norm"}
_CLIP_LAYER_NAMES = {"norm1": "layer_norm1", "attn.proj": "self_attn.out_proj", "norm2": "layer_norm2",
                     "mlp.0": "mlp.fc1", "mlp.2": "mlp.fc2"}  # fmt: skip
_CLIP_TOP_NAMES = {"visual.patch_embedding": "embeddings.patch_embedding", "visual.pre_norm": "pre_layrnorm",
                   "visual.post_norm": "post_layernorm"}  # fmt: skip
# Parts of the CLIP file no Wan pipeline reads: the text tower, its logit scale and the joint-space projection.
CLIP_UNUSED = re.compile(r"^(textual\.|log_scale$|visual\.head$)")
_QKV = ("q_proj", "k_proj", "v_proj")
_PARAM = re.compile(r"^(?P<module>.+)\.(?P<param>weight|bias)$")
_UMT5_BLOCK = re.compile(r"^blocks\.(?P<index>\d+)\.(?P<layer>.+)$")
_CLIP_BLOCK = re.compile(r"^visual\.transformer\.(?P<index>\d+)\.(?P<layer>.+)$")
_UMT5_MODEL_BLOCK = re.compile(r"^encoder\.block\.(?P<index>\d+)\.(?P<layer>.+)$")
_CLIP_MODEL_BLOCK = re.compile(r"^encoder\.layers\.(?P<index>\d+)\.(?P<layer>.+)$")

Source = tuple[str, Any]  # (checkpoint key, convert function or None)


def is_umt5(shapes: dict[str, tuple[int, ...]]) -> bool:
    """Whether original keys are Wan's T5 encoder."""
    return "token_embedding.weight" in shapes and "blocks.0.attn.q.weight" in shapes


def is_clip(shapes: dict[str, tuple[int, ...]]) -> bool:
    """Whether original keys are Wan's XLM-RoBERTa CLIP."""
    return "visual.transformer.0.attn.to_qkv.weight" in shapes


def _rename(key: str, top: dict[str, str], block: re.Pattern, layers: dict[str, str], block_prefix: str) -> str | None:
    match = _PARAM.match(key)
    if match is None:
        return None
    module, param = match["module"], match["param"]
    if module in top:
        return f"{top[module]}.{param}"
    inside = block.match(module)
    if inside is None or inside["layer"] not in layers:
        return None
    return f"{block_prefix}.{inside['index']}.{layers[inside['layer']]}.{param}"


def umt5_model_keys(checkpoint_keys: list[str]) -> dict[str, Source]:
    """``{UMT5EncoderModel key: (original key, None)}``; unknown keys keep their name (reported as unexpected)."""
    sources = {}
    for key in checkpoint_keys:
        new = _rename(key, _UMT5_TOP_NAMES, _UMT5_BLOCK, _UMT5_BLOCK_NAMES, "encoder.block")
        sources[new or key] = (key, None)
    return sources


def umt5_original_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A ``UMT5EncoderModel`` state dict under the original names (the tied ``encoder.embed_tokens`` is dropped)."""
    top = {new: old for old, new in _UMT5_TOP_NAMES.items()}
    layers = {new: old for old, new in _UMT5_BLOCK_NAMES.items()}
    original = {}
    for key, tensor in state_dict.items():
        if key == "encoder.embed_tokens.weight":
            continue
        new = _rename(key, top, _UMT5_MODEL_BLOCK, layers, "blocks")
        if new is None:
            raise ValueError(f"UMT5EncoderModel key {key!r} has no counterpart in Wan's T5 encoder")
        original[new] = tensor
    return original


def umt5_config(shapes: dict[str, tuple[int, ...]], file: str) -> dict[str, Any]:
    """``UMT5Config`` arguments of an original T5 encoder file, from its shapes."""
    try:
        vocab_size, d_model = shapes["token_embedding.weight"]
        buckets, heads = shapes["blocks.0.pos_embedding.embedding.weight"]
        d_ff = shapes["blocks.0.ffn.fc1.weight"][0]
        inner = shapes["blocks.0.attn.q.weight"][0]
    except (KeyError, ValueError) as error:
        raise ModelLoadError(f"{file} lacks a tensor every Wan T5 encoder has ({error}); the file is incomplete or "
                             "another model: download it again") from None
    layers = 1 + max(int(m["index"]) for key in shapes if (m := _UMT5_BLOCK.match(key)))
    return {
        "vocab_size": vocab_size, "d_model": d_model, "d_kv": inner // heads, "d_ff": d_ff, "num_layers": layers,
        "num_heads": heads, "relative_attention_num_buckets": buckets,
        "relative_attention_max_distance": UMT5_MAX_DISTANCE, "feed_forward_proj": "gated-gelu",
        "layer_norm_epsilon": 1e-6, "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0,
    }  # fmt: skip


def _qkv_part(index: int, tensor: torch.Tensor) -> torch.Tensor:
    return tensor.chunk(3, dim=0)[index]


def _drop_leading_axes(dims: int, tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(tensor.shape[-dims:])


def clip_model_keys(checkpoint_keys: list[str]) -> dict[str, Source]:
    """``{CLIPVisionModel key: (original key, convert)}`` for the vision tower; unused keys are left out and unknown
    ones keep their name (reported as unexpected)."""
    sources: dict[str, Source] = {}
    for key in checkpoint_keys:
        if CLIP_UNUSED.match(key):
            continue
        if key == "visual.cls_embedding":
            sources["embeddings.class_embedding"] = (key, functools.partial(_drop_leading_axes, 1))
            continue
        if key == "visual.pos_embedding":
            sources["embeddings.position_embedding.weight"] = (key, functools.partial(_drop_leading_axes, 2))
            continue
        match = _PARAM.match(key)
        inside = _CLIP_BLOCK.match(match["module"]) if match else None
        if inside is not None and inside["layer"] == "attn.to_qkv":
            for index, name in enumerate(_QKV):
                model_key = f"encoder.layers.{inside['index']}.self_attn.{name}.{match['param']}"
                sources[model_key] = (key, functools.partial(_qkv_part, index))
            continue
        new = _rename(key, _CLIP_TOP_NAMES, _CLIP_BLOCK, _CLIP_LAYER_NAMES, "encoder.layers")
        sources[new or key] = (key, None)
    return sources


def clip_original_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A ``CLIPVisionModel`` state dict under the original ``visual.*`` names (q, k, v fused back into ``to_qkv``)."""
    top = {new: old for old, new in _CLIP_TOP_NAMES.items()}
    layers = {new: old for old, new in _CLIP_LAYER_NAMES.items()}
    original = {}
    for key, tensor in state_dict.items():
        if key == "embeddings.class_embedding":
            original["visual.cls_embedding"] = tensor.reshape(1, 1, -1)
        elif key == "embeddings.position_embedding.weight":
            original["visual.pos_embedding"] = tensor.unsqueeze(0)
        elif (match := re.match(r"^encoder\.layers\.(\d+)\.self_attn\.([qkv])_proj\.(weight|bias)$", key)):
            if match[2] == "q":
                parts = [state_dict[f"encoder.layers.{match[1]}.self_attn.{p}.{match[3]}"] for p in _QKV]
                original[f"visual.transformer.{match[1]}.attn.to_qkv.{match[3]}"] = torch.cat(parts)
        else:
            new = _rename(key, top, _CLIP_MODEL_BLOCK, layers, "visual.transformer")
            if new is None:
                raise ValueError(f"CLIPVisionModel key {key!r} has no counterpart in Wan's CLIP vision tower")
            original[new] = tensor
    return original


def clip_config(shapes: dict[str, tuple[int, ...]], file: str) -> dict[str, Any]:
    """``CLIPVisionConfig`` arguments of an original CLIP file, from its vision tower's shapes."""
    try:
        hidden, _, patch, _ = shapes["visual.patch_embedding.weight"]
        positions = shapes["visual.pos_embedding"][1]
        intermediate = shapes["visual.transformer.0.mlp.0.weight"][0]
    except (KeyError, ValueError) as error:
        raise ModelLoadError(f"{file} lacks a tensor every Wan CLIP vision tower has ({error}); the file is "
                             "incomplete or another model: download it again") from None
    side = round((positions - 1) ** 0.5)
    if side * side != positions - 1 or hidden % CLIP_NUM_HEADS:
        raise ModelLoadError(f"{file}: {positions} position embeddings and width {hidden} do not make a square "
                             f"patch grid with {CLIP_NUM_HEADS} heads; the file is not Wan's CLIP vision tower")
    layers = 1 + max(int(m["index"]) for key in shapes if (m := _CLIP_BLOCK.match(key)))
    projection = shapes.get("visual.head", (hidden, hidden))[1]
    return {
        "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
        "num_attention_heads": CLIP_NUM_HEADS, "image_size": side * patch, "patch_size": patch,
        "projection_dim": projection, "hidden_act": "gelu", "layer_norm_eps": CLIP_LAYER_NORM_EPS,
    }  # fmt: skip


def clip_image_processor_config(image_size: int) -> dict[str, Any]:
    """The ``CLIPImageProcessor`` settings of the Wan2.1 image-to-video repositories at ``image_size`` pixels."""
    return {
        "crop_size": {"height": image_size, "width": image_size}, "do_center_crop": True, "do_convert_rgb": True,
        "do_normalize": True, "do_rescale": True, "do_resize": True, "image_mean": list(CLIP_IMAGE_MEAN),
        "image_processor_type": "CLIPImageProcessor", "image_std": list(CLIP_IMAGE_STD), "resample": 3,
        "rescale_factor": 1 / 255, "size": {"shortest_edge": image_size},
    }  # fmt: skip
