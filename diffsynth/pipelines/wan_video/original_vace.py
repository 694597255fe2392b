"""The original layout of the Wan VACE releases, read into diffusers' ``WanVACETransformer3DModel``.

``Wan-AI/Wan2.1-VACE-1.3B`` / ``-14B``, ``iic/VACE-Wan2.1-1.3B-Preview`` and ``PAI/Wan2.2-VACE-Fun-A14B`` (its
``high_noise_model/`` and ``low_noise_model/``) ship a ``WanModel``-style folder whose ``config.json`` names
``VaceWanModel`` (``model_type`` ``vace``) with two extra fields: ``vace_layers`` (the main blocks after which a
VACE hint is added) and ``vace_in_dim`` (the channels of the control context: 2 x 16 video latents + 64 mask
channels). Its shards hold the plain ``WanModel`` tensors plus ``vace_patch_embedding.*`` and ``vace_blocks.<i>.*``
(each a Wan block, the first with ``before_proj``, every one with ``after_proj``). diffusers' Wan converter renames
those too (``before_proj`` -> ``proj_in``, ``after_proj`` -> ``proj_out``); this module adds the config fields and
the inverse names, used to write original-layout files.
"""

from __future__ import annotations

from typing import Any

ORIGINAL_VACE_CLASS = "VaceWanModel"
VACE_DIT_CLASS = "WanVACETransformer3DModel"
# The VACE control context: inactive and reactive video latents (16 channels each) and the 8x8-folded mask.
VACE_IN_DIM = 96
# diffusers' layer names inside a VACE block that a plain Wan block lacks -> the original code's.
VACE_BLOCK_EXTRA = {"proj_in": "before_proj", "proj_out": "after_proj"}
VACE_TOP = {"vace_patch_embedding": "vace_patch_embedding"}


def is_vace_config(config: dict[str, Any]) -> bool:
    """Whether an original DiT ``config.json`` describes a VACE model (its class, its ``model_type`` or its
    ``vace_layers`` say so)."""
    return (config.get("_class_name") == ORIGINAL_VACE_CLASS or config.get("model_type") == "vace"
            or "vace_layers" in config)


def vace_config(original: dict[str, Any], shapes: dict[str, tuple[int, ...]], num_layers: int) -> dict[str, Any]:
    """The VACE fields of ``WanVACETransformer3DModel``'s config: ``vace_layers`` as the release lists them (default:
    every second block, the original code's default) and ``vace_in_channels`` from the VACE patch embedding."""
    layers = original.get("vace_layers") or list(range(0, num_layers, 2))
    embedding = shapes.get("vace_patch_embedding.weight")
    in_dim = embedding[1] if embedding is not None else int(original.get("vace_in_dim") or VACE_IN_DIM)
    return {"vace_layers": [int(layer) for layer in layers], "vace_in_channels": int(in_dim)}


def vace_original_key(key: str, block_names: dict[str, str]) -> str | None:
    """The original name of a ``WanVACETransformer3DModel`` key outside the main blocks (``vace_blocks.*``,
    ``vace_patch_embedding.*``), with ``block_names`` the Wan block's diffusers -> original layer names; None for a
    key of the plain Wan model."""
    parts = key.split(".")
    if parts[0] in VACE_TOP:
        return key
    if parts[0] != "vace_blocks":
        return None
    tail = parts[-1] if parts[-1] in ("weight", "bias") else None
    layer = ".".join(parts[2:-1] if tail else parts[2:])
    names = {**block_names, **VACE_BLOCK_EXTRA}
    if layer not in names:
        raise ValueError(f"WanVACETransformer3DModel key {key!r} has no counterpart in the original VaceWanModel")
    return f"vace_blocks.{parts[1]}.{names[layer]}" + (f".{tail}" if tail else "")


def original_vace_config_json(config: dict[str, Any]) -> dict[str, Any]:
    """The VACE fields an original ``config.json`` adds to a ``WanModel``'s (see ``original_dit_config_json``)."""
    return {"_class_name": ORIGINAL_VACE_CLASS, "model_type": "vace", "vace_layers": list(config["vace_layers"]),
            "vace_in_dim": config["vace_in_channels"]}
