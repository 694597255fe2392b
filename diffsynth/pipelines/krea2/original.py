"""Krea 2's released single files (``raw.safetensors`` of ``krea/Krea-2-Raw``, ``turbo.safetensors`` of
``krea/Krea-2-Turbo``), loaded into diffusers' ``Krea2Transformer2DModel``.

The files hold Krea's own module tree (krea-ai/krea-2's ``SingleStreamDiT``), which the reference and ComfyUI run.
The names, as diffusers' ``convert_krea2_transformer_checkpoint_to_diffusers`` maps them (that function is not used:
it converts a whole state dict, while the loader plans from the headers and converts one tensor at a time):

=======================================================  ==========================================================
Krea (``raw.safetensors``)                                diffusers ``Krea2Transformer2DModel``
=======================================================  ==========================================================
``first``                                                 ``img_in``
``tmlp.0`` / ``tmlp.2``                                   ``time_embed.linear_1`` / ``linear_2``
``tproj.1``                                               ``time_mod_proj``
``txtmlp.0.scale`` / ``txtmlp.1`` / ``txtmlp.3``          ``txt_in.norm.weight`` / ``txt_in.linear_1`` / ``linear_2``
``txtfusion.{layerwise,refiner}_blocks.N``                ``text_fusion.{layerwise,refiner}_blocks.N``
``blocks.N``                                              ``transformer_blocks.N``
``last.linear`` / ``last.norm.scale``                     ``final_layer.linear`` / ``final_layer.norm.weight``
``last.modulation.lin`` (2, hidden)                       ``final_layer.scale_shift_table``
in a block: ``attn.wq/wk/wv/wo/gate``                     ``attn.to_q/to_k/to_v/to_out.0/to_gate``
``attn.qknorm.{q,k}norm.scale``                           ``attn.norm_{q,k}.weight``
``mlp.{gate,up,down}``                                    ``ff.{gate,up,down}``
``prenorm.scale`` / ``postnorm.scale``                    ``norm1.weight`` / ``norm2.weight``
``mod.lin`` (6 x hidden, flat)                            ``scale_shift_table`` (6, hidden)
=======================================================  ==========================================================

Keys may carry ComfyUI's ``model.diffusion_model.`` prefix. ``last.down`` and ``last.up`` (in the released files,
used by no forward pass; the reference drops them too) are skipped. What the files do not record is the rotary split
of the head dim (a quarter, then three eighths twice: 32, 48, 48 of the released 128), the rotary base (1000) and the
norms' epsilon (1e-5): diffusers' defaults, which are the release's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from ...core.loader.errors import ModelLoadError
from ...core.loader.original_layout import OriginalModel, converted_entries, single_file_entries

_PREFIX = "model.diffusion_model."
# Tensors of the released files that no forward pass reads.
_UNUSED = ("last.down.weight", "last.up.weight")
# (Krea, diffusers) name prefixes outside the blocks; the first that matches applies.
_TOP = (
    ("first.", "img_in."), ("tmlp.0.", "time_embed.linear_1."), ("tmlp.2.", "time_embed.linear_2."),
    ("tproj.1.", "time_mod_proj."), ("txtmlp.0.scale", "txt_in.norm.weight"), ("txtmlp.1.", "txt_in.linear_1."),
    ("txtmlp.3.", "txt_in.linear_2."), ("txtfusion.", "text_fusion."), ("blocks.", "transformer_blocks."),
    ("last.linear.", "final_layer.linear."), ("last.norm.scale", "final_layer.norm.weight"),
    ("last.modulation.lin", "final_layer.scale_shift_table"),
)
# (Krea, diffusers) parts of a name inside a block (transformer or text-fusion).
_IN_BLOCK = (
    (".attn.wq.", ".attn.to_q."), (".attn.wk.", ".attn.to_k."), (".attn.wv.", ".attn.to_v."),
    (".attn.wo.", ".attn.to_out.0."), (".attn.gate.", ".attn.to_gate."),
    (".attn.qknorm.qnorm.scale", ".attn.norm_q.weight"), (".attn.qknorm.knorm.scale", ".attn.norm_k.weight"),
    (".mlp.", ".ff."), (".prenorm.scale", ".norm1.weight"), (".postnorm.scale", ".norm2.weight"),
    (".mod.lin", ".scale_shift_table"),
)
_MARKER = "txtfusion.projector.weight"
_BLOCK_MODULATION = re.compile(r"^transformer_blocks\.\d+\.scale_shift_table$")


def _rename(key: str, pairs: tuple[tuple[str, str], ...], top: tuple[tuple[str, str], ...]) -> str:
    for old, new in top:
        if key.startswith(old):
            key = new + key[len(old):]
            break
    for old, new in pairs:
        key = key.replace(old, new)
    return key


def diffusers_key(key: str) -> str:
    """The ``Krea2Transformer2DModel`` name of a tensor of Krea's layout."""
    return _rename(key.removeprefix(_PREFIX), _IN_BLOCK, _TOP)


def original_key(key: str) -> str:
    """The Krea-layout name of a ``Krea2Transformer2DModel`` tensor (inverse of ``diffusers_key``)."""
    swap = lambda pairs: tuple((new, old) for old, new in pairs)  # noqa: E731
    return _rename(key, swap(_IN_BLOCK), swap(_TOP))


def _count(keys: list[str], prefix: str) -> int:
    pattern = re.compile(rf"^{re.escape(prefix)}\.(\d+)\.")
    return 1 + max((int(match[1]) for key in keys if (match := pattern.match(key))), default=-1)


def transformer_config(shapes: dict[str, tuple[int, ...]], file: Path | str) -> dict[str, Any]:
    """The ``Krea2Transformer2DModel`` config of a Krea-layout file, from its tensor shapes (diffusers' names).

    Raises:
        ModelLoadError: A tensor the sizes are read from is missing.
    """
    try:
        hidden, in_channels = shapes["img_in.weight"]
        (head_dim,) = shapes["transformer_blocks.0.attn.norm_q.weight"]
        text_dim = shapes["txt_in.linear_1.weight"][1]
        (text_head_dim,) = shapes["text_fusion.refiner_blocks.0.attn.norm_q.weight"]
        config = {
            "in_channels": in_channels, "num_layers": _count(list(shapes), "transformer_blocks"),
            "attention_head_dim": head_dim, "num_attention_heads": hidden // head_dim,
            "num_key_value_heads": shapes["transformer_blocks.0.attn.to_k.weight"][0] // head_dim,
            "intermediate_size": shapes["transformer_blocks.0.ff.gate.weight"][0],
            "timestep_embed_dim": shapes["time_embed.linear_1.weight"][1], "text_hidden_dim": text_dim,
            "num_text_layers": shapes["text_fusion.projector.weight"][1],
            "text_num_attention_heads": text_dim // text_head_dim,
            "text_num_key_value_heads": shapes["text_fusion.refiner_blocks.0.attn.to_k.weight"][0] // text_head_dim,
            "text_intermediate_size": shapes["text_fusion.refiner_blocks.0.ff.gate.weight"][0],
            "num_layerwise_text_blocks": _count(list(shapes), "text_fusion.layerwise_blocks"),
            "num_refiner_text_blocks": _count(list(shapes), "text_fusion.refiner_blocks"),
        }  # fmt: skip
    except KeyError as missing:
        raise ModelLoadError(f"{file} looks like a Krea 2 transformer but lacks {missing.args[0]!r} (as "
                             f"{original_key(missing.args[0])!r}); the file is incomplete: download it again") from None
    quarter = head_dim // 4
    config["axes_dims_rope"] = (quarter, (head_dim - quarter) // 2, head_dim - quarter - (head_dim - quarter) // 2)
    return config


def _flat_to_table(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(6, -1)


def identify(files: list[Path]) -> OriginalModel | None:
    """The Krea 2 transformer ``files`` hold (one safetensors file in Krea's layout), or None for anything else.

    Only the header is read; a config.json is not needed.

    Raises:
        ModelLoadError: The file looks like a Krea 2 transformer but lacks tensors its structure needs.
    """
    found = single_file_entries(list(files))
    if found is None:
        return None
    file, entries = found
    if _MARKER not in entries and _PREFIX + _MARKER not in entries:
        return None
    sources = {diffusers_key(key): (key, None) for key in entries if key.removeprefix(_PREFIX) not in _UNUSED}
    sources = {name: (key, _flat_to_table if _BLOCK_MODULATION.match(name) else None)
               for name, (key, _) in sources.items()}
    shapes = {name: entries[key].shape for name, (key, _) in sources.items()}
    config = transformer_config(shapes, file)
    return OriginalModel(kind="dit", library="diffusers", class_name="Krea2Transformer2DModel", config=config,
                         entries=converted_entries(entries, sources), source=file)


def transformer_to_original(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A ``Krea2Transformer2DModel`` state dict in Krea's layout (``raw.safetensors``), the blocks' modulation tables
    flattened back: what the tiny repos and ``--full_checkpoint_format original`` write."""
    return {original_key(key): value.flatten() if _BLOCK_MODULATION.match(key) else value
            for key, value in state_dict.items()}
