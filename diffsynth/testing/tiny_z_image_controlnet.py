"""Tiny random-weight Z-Image-Turbo Fun ControlNets (``PAI/Z-Image-Turbo-Fun-Controlnet-Union-2.1``) in the released
single-file layout.

The release holds three ControlNets of one architecture, each one safetensors file under diffusers' names with no
config (``pipelines/z_image/original.py`` reads it): the Union ControlNet, its 8-step variant, and the Tile one. The
tiny ones match the tiny Z-Image-Turbo transformer (width 32, two heads, one noise-refiner block): one control block
(its hints go to main block 0) and one control block beside the noise refiner, reading 33 control channels, as the
2.1 releases do. diffusers starts ``before_proj`` and ``after_proj`` at zero, which would make the ControlNet a
no-op; here they are random too, so that a control image moves the output.
"""

from __future__ import annotations

from pathlib import Path

from .tiny_common import prepare_repo, seeded
from .tiny_z_image import TRANSFORMER_CONFIG

Z_IMAGE_CONTROLNET_MODEL_ID = "PAI/Z-Image-Turbo-Fun-Controlnet-Union-2.1"
# The release's files, each with its own seed offset.
Z_IMAGE_CONTROLNET_FILES = {
    "Z-Image-Turbo-Fun-Controlnet-Union-2.1.safetensors": 11,
    "Z-Image-Turbo-Fun-Controlnet-Union-2.1-8steps.safetensors": 12,
    "Z-Image-Turbo-Fun-Controlnet-Tile-2.1-8steps.safetensors": 13,
}
CONTROLNET_CONFIG = {
    "control_layers_places": [0], "control_refiner_layers_places": [0], "control_in_dim": 33,
    "add_control_noise_refiner": "control_noise_refiner", "all_patch_size": [2], "all_f_patch_size": [1],
    "dim": TRANSFORMER_CONFIG["dim"], "n_refiner_layers": TRANSFORMER_CONFIG["n_refiner_layers"],
    "n_heads": TRANSFORMER_CONFIG["n_heads"], "n_kv_heads": TRANSFORMER_CONFIG["n_kv_heads"], "norm_eps": 1e-5,
    "qk_norm": True,
}  # fmt: skip


def build_tiny_z_image_controlnet(root: Path, seed: int = 0) -> Path:
    """Writes the tiny ControlNet release at ``root/PAI/Z-Image-Turbo-Fun-Controlnet-Union-2.1`` (float32)."""
    import torch
    from diffusers import ZImageControlNetModel
    from safetensors.torch import save_file

    repo = prepare_repo(root, Z_IMAGE_CONTROLNET_MODEL_ID)
    for name, offset in Z_IMAGE_CONTROLNET_FILES.items():
        with seeded(seed + offset):
            model = ZImageControlNetModel(**CONTROLNET_CONFIG)
            for key, param in model.named_parameters():
                if ".before_proj." in key or ".after_proj." in key:
                    torch.nn.init.normal_(param, std=0.2)
        save_file({key: value.contiguous() for key, value in model.state_dict().items()}, str(repo / name))
    return repo


Z_IMAGE_CONTROLNET_BUILDERS = {"z_image_controlnet": build_tiny_z_image_controlnet}
