"""A tiny random-weight Qwen-Image-Layered repo in the released layout: ``transformer/`` (QwenImageTransformer2DModel
with the 3D layer rope and the extra timestep condition, sharded), ``vae/`` (AutoencoderKLQwenImage reading and
writing RGBA) and ``scheduler/``. The reference's scripts take the text encoder and tokenizer from ``Qwen/Qwen-Image``
(see ``tiny_models``), so the tiny repo holds none. Not among ``tiny_models.BUILDERS``: only the Layered tests build it.
"""

from __future__ import annotations

from pathlib import Path

from .tiny_common import SHARD_SIZE, prepare_repo, seeded, write_json
from .tiny_models import QWEN_IMAGE_SCHEDULER_CONFIG

QWEN_IMAGE_LAYERED_MODEL_ID = "Qwen/Qwen-Image-Layered"


def build_tiny_qwen_image_layered(root: Path, seed: int = 0, joint_attention_dim: int = 32) -> Path:
    """Writes the tiny Qwen-Image-Layered repo at ``root/Qwen/Qwen-Image-Layered`` and returns its folder.

    ``joint_attention_dim`` must be the tiny Qwen-Image text encoder's hidden size (32), which it reads prompts from.
    """
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel

    repo = prepare_repo(root, QWEN_IMAGE_LAYERED_MODEL_ID)
    with seeded(seed + 20):
        transformer = QwenImageTransformer2DModel(
            patch_size=2, in_channels=64, out_channels=16, num_layers=2, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=joint_attention_dim, guidance_embeds=False,
            axes_dims_rope=(8, 4, 4), use_additional_t_cond=True, use_layer3d_rope=True,
        )  # fmt: skip
    transformer.save_pretrained(repo / "transformer", max_shard_size=SHARD_SIZE)
    with seeded(seed + 21):
        vae = AutoencoderKLQwenImage(
            base_dim=16, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1, temperal_downsample=[False, True, True],
            input_channels=4, latents_mean=[round(-0.4 + 0.05 * i, 2) for i in range(16)],
            latents_std=[round(0.6 + 0.05 * i, 2) for i in range(16)],
        )  # fmt: skip
    vae.save_pretrained(repo / "vae")
    write_json(repo / "scheduler" / "scheduler_config.json", QWEN_IMAGE_SCHEDULER_CONFIG)
    return repo
