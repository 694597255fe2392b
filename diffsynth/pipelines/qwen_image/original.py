"""The Qwen-Image Blockwise ControlNets' released layout: one ``model.safetensors`` with no config.

``DiffSynth-Studio/Qwen-Image-Blockwise-ControlNet-{Canny,Depth,Inpaint}`` each ship one file whose tensor names are
``QwenImageBlockwiseControlNet``'s own (``blockwise_model.py``). The config is read from the shapes: the width and
input channels from ``img_in.weight`` (64, or 68 for Inpaint's extra mask channels), the blocks from
``controlnet_blocks.<i>``. A file written by ``--trainable_models blockwise_controlnet`` with ``--remove_prefix_in_ckpt
pipe.blockwise_controlnet.models.0.`` (or the reference's initialisation script) has the same names and reads alike.
"""

from __future__ import annotations

import re
from pathlib import Path

from ...core.loader.original_layout import OriginalModel, renamed_entries, single_file_entries
from ...core.model_traits import register_model_module

BLOCKWISE_CLASS = "QwenImageBlockwiseControlNet"
register_model_module("diffsynth.pipelines.qwen_image.blockwise_model", library="diffusers")
# A packed latent token: 16 channels x a 2x2 patch.
PACKED_LATENT_CHANNELS = 64
_BLOCK = re.compile(r"^controlnet_blocks\.(\d+)\.")


def identify(files: list[Path]) -> OriginalModel | None:
    """The Blockwise ControlNet ``files`` hold (one safetensors file with ``img_in`` and ``controlnet_blocks.0.x_rms``),
    or None."""
    found = single_file_entries(list(files))
    if found is None:
        return None
    file, entries = found
    shapes = {key: entry.shape for key, entry in entries.items()}
    if "img_in.weight" not in shapes or "controlnet_blocks.0.x_rms.weight" not in shapes:
        return None
    dim, columns = shapes["img_in.weight"]
    blocks = {int(match.group(1)) for key in shapes if (match := _BLOCK.match(key))}
    config = {"num_layers": len(blocks), "in_dim": PACKED_LATENT_CHANNELS,
              "additional_in_dim": columns - PACKED_LATENT_CHANNELS, "dim": dim}
    return OriginalModel(kind="controlnet", library="diffusers", class_name=BLOCKWISE_CLASS, config=config,
                         entries=renamed_entries(entries, {key: key for key in shapes}), source=file)
