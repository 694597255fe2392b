"""Tiny random-weight Qwen-Image-Layered and Qwen-Image-Layered-Control repos in the released layouts: Layered's
``transformer/`` (QwenImageTransformer2DModel with the 3D layer rope and the extra timestep condition, sharded),
``vae/`` (AutoencoderKLQwenImage reading and writing RGBA) and ``scheduler/``; Layered-Control's ``transformer/``. The
reference's scripts take the text encoder and tokenizer from ``Qwen/Qwen-Image`` (see ``tiny_models``), so the tiny
repos hold none. Not among ``tiny_models.BUILDERS``: only the Layered tests build them.
"""

from __future__ import annotations

from pathlib import Path

from .tiny_common import SHARD_SIZE, prepare_repo, seeded, write_json
from .tiny_models import QWEN_IMAGE_SCHEDULER_CONFIG

QWEN_IMAGE_LAYERED_MODEL_ID = "Qwen/Qwen-Image-Layered"
QWEN_IMAGE_LAYERED_CONTROL_MODEL_ID = "DiffSynth-Studio/Qwen-Image-Layered-Control"


def _write_layered_transformer(repo: Path, seed: int, joint_attention_dim: int) -> None:
    """A tiny sharded ``transformer/``: QwenImageTransformer2DModel with the 3D layer rope and the extra timestep
    condition."""
    from diffusers import QwenImageTransformer2DModel

    with seeded(seed):
        transformer = QwenImageTransformer2DModel(
            patch_size=2, in_channels=64, out_channels=16, num_layers=2, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=joint_attention_dim, guidance_embeds=False,
            axes_dims_rope=(8, 4, 4), use_additional_t_cond=True, use_layer3d_rope=True,
        )  # fmt: skip
    transformer.save_pretrained(repo / "transformer", max_shard_size=SHARD_SIZE)


def build_tiny_qwen_image_layered(root: Path, seed: int = 0, joint_attention_dim: int = 32) -> Path:
    """Writes the tiny Qwen-Image-Layered repo at ``root/Qwen/Qwen-Image-Layered`` and returns its folder.

    ``joint_attention_dim`` must be the tiny Qwen-Image text encoder's hidden size (32), which it reads prompts from.
    """
    from diffusers import AutoencoderKLQwenImage

    repo = prepare_repo(root, QWEN_IMAGE_LAYERED_MODEL_ID)
    _write_layered_transformer(repo, seed + 20, joint_attention_dim)
    with seeded(seed + 21):
        vae = AutoencoderKLQwenImage(
            base_dim=16, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1, temperal_downsample=[False, True, True],
            input_channels=4, latents_mean=[round(-0.4 + 0.05 * i, 2) for i in range(16)],
            latents_std=[round(0.6 + 0.05 * i, 2) for i in range(16)],
        )  # fmt: skip
    vae.save_pretrained(repo / "vae")
    write_json(repo / "scheduler" / "scheduler_config.json", QWEN_IMAGE_SCHEDULER_CONFIG)
    return repo


def build_tiny_qwen_image_layered_control(root: Path, seed: int = 0, joint_attention_dim: int = 32) -> Path:
    """Writes the tiny DiffSynth-Studio/Qwen-Image-Layered-Control repo (its ``transformer/`` only: the reference's
    scripts take the VAE from Qwen-Image-Layered and the text encoder from Qwen-Image) and returns its folder.

    The release is Qwen-Image-Layered's transformer fine-tuned to extract one layer (``layer_num=0``): the same
    class and config, other weights."""
    repo = prepare_repo(root, QWEN_IMAGE_LAYERED_CONTROL_MODEL_ID)
    _write_layered_transformer(repo, seed + 22, joint_attention_dim)
    return repo
