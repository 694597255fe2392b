"""The Z-Image-Turbo Fun ControlNets' released single-file layout, read into diffusers' ``ZImageControlNetModel``.

``PAI/Z-Image-Turbo-Fun-Controlnet-Union-2.1`` ships each ControlNet as one safetensors file with no config:
``Z-Image-Turbo-Fun-Controlnet-Union-2.1.safetensors``, ``...-Union-2.1-8steps.safetensors`` and
``...-Tile-2.1-8steps.safetensors``. Its tensor names are diffusers' own (diffusers' single-file converter passes
them through): ``control_all_x_embedder.2-1``, ``control_layers.<i>.*`` (the transformer blocks whose hints are
added to every second main block; block 0 has ``before_proj``, every block ``after_proj``) and
``control_noise_refiner.<i>.*`` (2.x releases: control blocks beside the noise refiner).

What the file does not record is read from the shapes: the width (the embedder's rows), the control channels (its
columns over the 2x2 patch: 33 = 16 control latents, 1 inpaint mask, 16 inpaint latents), the heads (the width over
a head's query-norm size), and the blocks. The main blocks the hints go to are not in the file either: the releases
put them on blocks 0, 2, 4, ... (``control_layers_places``), as the original code and the reference do.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ...core.loader.errors import ModelLoadError
from ...core.loader.original_layout import OriginalModel, renamed_entries, single_file_entries

CONTROLNET_CLASS = "ZImageControlNetModel"
_EMBEDDER = "control_all_x_embedder.2-1.weight"
_PATCH_CELLS = 4  # a 2x2 patch of one frame
_BLOCK = re.compile(r"^(control_layers|control_noise_refiner)\.(\d+)\.")


def identify(files: list[Path]) -> OriginalModel | None:
    """The Z-Image Fun ControlNet ``files`` hold (one safetensors file with ``control_all_x_embedder.2-1``), or None.

    Raises:
        ModelLoadError: The file has the embedder but lacks the control blocks' tensors the config is read from.
    """
    found = single_file_entries(list(files))
    if found is None:
        return None
    file, entries = found
    shapes = {key: entry.shape for key, entry in entries.items()}
    if _EMBEDDER not in shapes or "control_layers.0.before_proj.weight" not in shapes:
        return None
    return OriginalModel(kind="controlnet", library="diffusers", class_name=CONTROLNET_CLASS,
                         config=controlnet_config(shapes, file),
                         entries=renamed_entries(entries, {key: key for key in shapes}), source=file)


def controlnet_config(shapes: dict[str, tuple[int, ...]], file: Path) -> dict[str, Any]:
    """``ZImageControlNetModel``'s config from the tensor shapes of a released ControlNet file.

    Raises:
        ModelLoadError: A tensor the config is read from is missing.
    """
    needed = ("control_layers.0.attention.norm_q.weight", "control_layers.0.attention.to_k.weight")
    missing = [key for key in needed if key not in shapes]
    if missing:
        raise ModelLoadError(f"{file} looks like a Z-Image Fun ControlNet but lacks {missing}; the file is damaged or "
                             "of another model: download it again")
    dim, columns = shapes[_EMBEDDER]
    head_dim = shapes["control_layers.0.attention.norm_q.weight"][0]
    blocks: dict[str, set[int]] = {"control_layers": set(), "control_noise_refiner": set()}
    for key in shapes:
        match = _BLOCK.match(key)
        if match:
            blocks[match.group(1)].add(int(match.group(2)))
    refiners = len(blocks["control_noise_refiner"])
    # 2.x files hold control blocks (with after_proj) beside the noise refiner; 1.0 files plain refiner blocks.
    refiner_kind = "control_noise_refiner" if "control_noise_refiner.0.after_proj.weight" in shapes else None
    return {
        "control_layers_places": [2 * index for index in range(len(blocks["control_layers"]))],
        "control_refiner_layers_places": list(range(refiners)), "control_in_dim": columns // _PATCH_CELLS,
        "add_control_noise_refiner": refiner_kind, "all_patch_size": [2], "all_f_patch_size": [1], "dim": dim,
        "n_refiner_layers": refiners or 2, "n_heads": dim // head_dim,
        "n_kv_heads": shapes["control_layers.0.attention.to_k.weight"][0] // head_dim, "norm_eps": 1e-5,
        "qk_norm": True,
    }  # fmt: skip
