"""The release layout of ``Wan-AI/Wan2.2-Animate-2-14B``, read into diffusers' ``WanAnimate2Transformer3DModel``.

The release ships each transformer as one safetensors file without a ``config.json``
(``wan_animate_2/wan_animate_2_bf16.safetensors`` and ``..._bf16_distillation.safetensors``) under the original
names: every block is wrapped in an in-context module (``blocks.N.block.self_attn.q``). diffusers' own single-file
converter, ``convert_wan_animate_2_transformer_to_diffusers``, gives the model's names (``blocks.N.self_attn.to_q``);
``animate2_original_key`` is its inverse, for writing files in the release's names (a full fine-tune, the tiny
release). The sizes come from the
tensors' shapes; the head count, which no shape carries, from Wan's head size of 128 (the release: 5120 wide, 40
heads).
"""

from __future__ import annotations

import re
from typing import Any

ANIMATE2_DIT_CLASS = "WanAnimate2Transformer3DModel"
# A tensor only the Animate-2 release has: the in-context wrapper of the first block.
ANIMATE2_MARKER = "blocks.0.block.self_attn.q.weight"
WAN_HEAD_DIM = 128
# diffusers' attention names -> the release's (the inverse of the converter's renames).
_ATTENTION = {"to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "o", "add_k_proj": "k_img", "add_v_proj": "v_img",
              "norm_added_k": "norm_k_img"}


def is_animate2(shapes: dict[str, Any]) -> bool:
    """Whether a checkpoint's tensors are Wan2.2-Animate-2's."""
    return ANIMATE2_MARKER in shapes


def animate2_config(shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """``WanAnimate2Transformer3DModel``'s config from the release's tensor shapes."""
    dim, in_dim, *patch = shapes["patch_embedding.weight"]
    layers = sum(1 for key in shapes if re.fullmatch(r"blocks\.\d+\.block\.self_attn\.q\.weight", key))
    return {
        "patch_size": list(patch), "in_dim": in_dim, "dim": dim, "ffn_dim": shapes["blocks.0.block.ffn.0.weight"][0],
        "freq_dim": shapes["time_embedding.0.weight"][1], "text_dim": shapes["text_embedding.0.weight"][1],
        "out_dim": shapes["head.head.weight"][0] // (patch[0] * patch[1] * patch[2]),
        "num_heads": max(1, dim // WAN_HEAD_DIM), "num_layers": layers,
        "cross_attn_norm": "blocks.0.block.norm3.weight" in shapes, "use_img_emb": "img_emb.proj.1.weight" in shapes,
    }  # fmt: skip


def animate2_model_keys(checkpoint_keys: list[str]) -> dict[str, str]:
    """``{model key: release key}`` by diffusers' ``convert_wan_animate_2_transformer_to_diffusers``."""
    from diffusers.loaders.single_file_utils import convert_wan_animate_2_transformer_to_diffusers

    return convert_wan_animate_2_transformer_to_diffusers({key: key for key in checkpoint_keys})


def animate2_original_key(key: str) -> str:
    """The release's name of a ``WanAnimate2Transformer3DModel`` key or module path (the converter's inverse)."""
    match = re.fullmatch(r"blocks\.(\d+)\.(self_attn|cross_attn)\.(.+?)((?:\.weight|\.bias)?)", key)
    if match:
        layer = _ATTENTION.get(match[3], match[3])
        return f"blocks.{match[1]}.block.{match[2]}.{layer}{match[4]}"
    return re.sub(r"^blocks\.(\d+)\.", r"blocks.\1.block.", key)

