"""JoyAI-Image-Edit's released transformer (``jd-opensource/JoyAI-Image-Edit:transformer/transformer.pth``), loaded
into diffusers' ``JoyImageEditTransformer3DModel``.

The file holds the JoyAI code's ``Transformer3DModel`` (the reference's ``JoyAIImageDiT``), possibly under a
``model.`` prefix. Its names are diffusers' but for the attention layers of a block, which diffusers gathers under
``attn.``:

====================================================  ==========================================================
JoyAI (``transformer.pth``)                           diffusers ``JoyImageEditTransformer3DModel``
====================================================  ==========================================================
``double_blocks.N.img_attn_qkv`` (and ``txt_``)       ``double_blocks.N.attn.img_attn_qkv``
``double_blocks.N.img_attn_proj``                     ``double_blocks.N.attn.img_attn_proj``
``double_blocks.N.img_attn_{q,k}_norm``               ``double_blocks.N.attn.img_attn_{q,k}_norm``
====================================================  ==========================================================

What the file does not record: the rotary split of the head dim (the release's 16, 56, 56 of 128, an eighth and
twice seven sixteenths; scaled alike for other head dims) and the rotary base (diffusers' default, 256).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ...core.loader.errors import ModelLoadError
from ...core.loader.original_layout import OriginalModel, renamed_entries
from ...core.loader.pth import PTH_SUFFIX
from ...core.loader.state_dict import read_headers

_PREFIX = "model."
_MARKER = "double_blocks.0.img_attn_qkv.weight"
_ATTENTION = re.compile(r"^(double_blocks\.\d+\.)((?:img|txt)_attn_(?:qkv|proj|q_norm|k_norm)\..*)$")
_DIFFUSERS_ATTENTION = re.compile(r"^(double_blocks\.\d+\.)attn\.(.*)$")


def diffusers_key(key: str) -> str:
    """The ``JoyImageEditTransformer3DModel`` name of a tensor of JoyAI's layout."""
    return _ATTENTION.sub(r"\1attn.\2", key.removeprefix(_PREFIX))


def original_key(key: str) -> str:
    """The JoyAI-layout name of a ``JoyImageEditTransformer3DModel`` tensor (inverse of ``diffusers_key``)."""
    return _DIFFUSERS_ATTENTION.sub(r"\1\2", key)


def rope_dims(head_dim: int) -> list[int]:
    """The rotary split of ``head_dim``: the release's ``[16, 56, 56]`` of 128, scaled."""
    frame = head_dim // 8
    return [frame, (head_dim - frame) // 2, head_dim - frame - (head_dim - frame) // 2]


def transformer_config(shapes: dict[str, tuple[int, ...]], file: Path | str) -> dict[str, Any]:
    """The ``JoyImageEditTransformer3DModel`` config of a JoyAI-layout file, from its tensor shapes (diffusers'
    names).

    Raises:
        ModelLoadError: A tensor the sizes are read from is missing.
    """
    try:
        hidden, in_channels, *patch = shapes["img_in.weight"]
        (head_dim,) = shapes["double_blocks.0.attn.img_attn_q_norm.weight"]
        text_dim = shapes["condition_embedder.text_embedder.linear_1.weight"][1]
        mlp = shapes["double_blocks.0.img_mlp.net.0.proj.weight"][0]
        out_features = shapes["proj_out.weight"][0]
    except KeyError as missing:
        raise ModelLoadError(f"{file} looks like a JoyAI-Image transformer but lacks {missing.args[0]!r} (as "
                             f"{original_key(missing.args[0])!r}); the file is incomplete: download it again") from None
    layers = 1 + max(int(key.split(".")[1]) for key in shapes if key.startswith("double_blocks."))
    patch_volume = patch[0] * patch[1] * patch[2]
    return {
        "patch_size": list(patch), "in_channels": in_channels, "out_channels": out_features // patch_volume,
        "hidden_size": hidden, "num_attention_heads": hidden // head_dim, "text_dim": text_dim,
        "mlp_width_ratio": mlp / hidden, "num_layers": layers, "rope_dim_list": rope_dims(head_dim),
    }  # fmt: skip


def identify(files: list[Path]) -> OriginalModel | None:
    """The JoyAI-Image transformer ``files`` hold (one ``.pth`` or safetensors file in JoyAI's layout), or None for
    anything else.

    Raises:
        ModelLoadError: The file looks like a JoyAI-Image transformer but lacks tensors its structure needs.
    """
    files = [path for path in files if path.is_file()]
    if len(files) != 1 or not files[0].name.endswith((PTH_SUFFIX, ".safetensors")):
        return None
    file, entries = files[0], read_headers(files)
    if _MARKER not in entries and _PREFIX + _MARKER not in entries:
        return None
    names = {diffusers_key(key): key for key in entries}
    config = transformer_config({name: entries[key].shape for name, key in names.items()}, file)
    return OriginalModel(kind="dit", library="diffusers", class_name="JoyImageEditTransformer3DModel", config=config,
                         entries=renamed_entries(entries, names), source=file)
