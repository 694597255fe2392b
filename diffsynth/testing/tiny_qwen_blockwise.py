"""Tiny random-weight Qwen-Image Blockwise ControlNets (``DiffSynth-Studio/Qwen-Image-Blockwise-ControlNet-Canny``,
``-Depth``, ``-Inpaint``) in the released layout: one ``model.safetensors`` per repository, no config.

They match the tiny Qwen-Image transformer (two blocks of width 32). The release starts ``img_in`` and each block's
``output_proj`` at zero before training; here every weight is random, so that a control image moves the output.
"""

from __future__ import annotations

from pathlib import Path

from .tiny_common import prepare_repo, seeded

QWEN_BLOCKWISE_MODEL_ID = "DiffSynth-Studio/Qwen-Image-Blockwise-ControlNet-{kind}"
# Each release's extra input channels (Inpaint: its mask's 2x2 patch) and seed offset.
QWEN_BLOCKWISE_KINDS = {"Canny": (0, 21), "Depth": (0, 22), "Inpaint": (4, 23)}
QWEN_BLOCKWISE_CONFIG = {"num_layers": 2, "in_dim": 64, "dim": 32}


def build_tiny_qwen_blockwise(root: Path, seed: int = 0) -> dict[str, Path]:
    """Writes the three tiny releases at ``root/DiffSynth-Studio/Qwen-Image-Blockwise-ControlNet-<kind>`` (float32);
    returns ``{kind: repo folder}``."""
    from safetensors.torch import save_file

    from ..pipelines.qwen_image.blockwise_model import QwenImageBlockwiseControlNet

    repos = {}
    for kind, (extra, offset) in QWEN_BLOCKWISE_KINDS.items():
        repo = repos[kind] = prepare_repo(root, QWEN_BLOCKWISE_MODEL_ID.format(kind=kind))
        with seeded(seed + offset):
            model = QwenImageBlockwiseControlNet(**QWEN_BLOCKWISE_CONFIG, additional_in_dim=extra)
        save_file({key: value.contiguous() for key, value in model.state_dict().items()}, str(repo / "model.safetensors"))
    return repos


QWEN_BLOCKWISE_BUILDERS = {"qwen_blockwise": build_tiny_qwen_blockwise}
