"""Tiny random-weight Z-Image repos (``Tongyi-MAI/Z-Image`` and ``Tongyi-MAI/Z-Image-Turbo``) in the released
diffusers layout.

Both repos hold the same text encoder (``Qwen3Model``), tokenizer and VAE (``AutoencoderKL`` with 16 latent channels
and the FLUX.1 VAE's scaling and shift factors), as the released ones do: the reference's commands load Turbo's text
encoder and VAE beside Z-Image's transformer. Each has its own ``ZImageTransformer2DModel`` and its own
``scheduler/scheduler_config.json`` (a static shift: 3 for Turbo, 6 for the base model). The shared parts are built
once per root and seed and hard-linked (copied where links fail) into the sibling repo, which keeps both repos
under a second to build.

File names follow the released repositories: ``transformer/diffusion_pytorch_model-0000i-of-0000n.safetensors``,
``text_encoder/model-0000i-of-0000n.safetensors`` (both with an index), ``vae/diffusion_pytorch_model.safetensors``,
``tokenizer/`` with Qwen3's chat template (``enable_thinking`` as diffusers' ``ZImagePipeline`` passes it), and a
root ``model_index.json`` naming ``ZImagePipeline``.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

from .tiny_common import SHARD_SIZE, model_index, padded, prepare_repo, seeded, write_json

Z_IMAGE_MODEL_ID = "Tongyi-MAI/Z-Image"
Z_IMAGE_TURBO_MODEL_ID = "Tongyi-MAI/Z-Image-Turbo"

# Patterns that select each component, as the reference's commands give them to --model_id_with_origin_paths.
Z_IMAGE_PATTERNS = {
    "dit": "transformer/*.safetensors",
    "text_encoder": "text_encoder/*.safetensors",
    "vae": "vae/diffusion_pytorch_model.safetensors",
    "tokenizer": "tokenizer/",
}

# scheduler/scheduler_config.json of each release: flow-match Euler with a static shift, no dynamic shifting.
Z_IMAGE_SCHEDULER_CONFIGS = {
    Z_IMAGE_TURBO_MODEL_ID: {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000,
                             "shift": 3.0, "use_dynamic_shifting": False},
    Z_IMAGE_MODEL_ID: {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000,
                       "shift": 6.0, "use_dynamic_shifting": False},
}

# Qwen3's chat template, reduced to what a single-turn text prompt needs: a generation prompt, and the empty thinking
# block Qwen3 inserts when ``enable_thinking`` is false (diffusers passes true, so Z-Image prompts carry none).
QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)
QWEN3_EXTRA_TOKENS = ("<think>", "</think>")

# Tiny sizes: the text encoder's hidden size is the transformer's cap_feat_dim; head_dim = dim / n_heads must equal
# sum(axes_dims); axes_lens[0] bounds the caption length plus the image's frame position.
TEXT_HIDDEN_SIZE = 32
TRANSFORMER_CONFIG = {
    "all_patch_size": [2], "all_f_patch_size": [1], "in_channels": 16, "dim": 32, "n_layers": 2,
    "n_refiner_layers": 1, "n_heads": 2, "n_kv_heads": 2, "norm_eps": 1e-5, "qk_norm": True,
    "cap_feat_dim": TEXT_HIDDEN_SIZE, "rope_theta": 256.0, "t_scale": 1000.0, "axes_dims": [4, 6, 6],
    "axes_lens": [1024, 64, 64],
}  # fmt: skip
# Transformer seed offset per release (the text encoder takes ``seed``, the VAE ``seed + 2``).
TRANSFORMER_SEEDS = {Z_IMAGE_MODEL_ID: 1, Z_IMAGE_TURBO_MODEL_ID: 3}

_COMPONENTS = {
    "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
    "text_encoder": ("transformers", "Qwen3Model"),
    "tokenizer": ("transformers", "Qwen2Tokenizer"),
    "transformer": ("diffusers", "ZImageTransformer2DModel"),
    "vae": ("diffusers", "AutoencoderKL"),
}
_SHARED_FOLDERS = ("text_encoder", "tokenizer", "vae")
_SHARED_CACHE = ".z_image_shared"


def build_qwen3_tokenizer():
    """The byte-level Qwen tokenizer of the tiny Qwen-Image repos plus Qwen3's thinking tokens, chat template and pad
    token (diffusers pads Z-Image prompts to ``max_sequence_length``)."""
    from .tiny_models import build_qwen_tokenizer  # imported here: tiny_models imports this module for BUILDERS

    tokenizer = build_qwen_tokenizer()
    tokenizer.add_tokens(list(QWEN3_EXTRA_TOKENS), special_tokens=True)
    tokenizer.pad_token = "<|endoftext|>"
    tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    return tokenizer


def _write_shared(folder: Path, seed: int) -> None:
    """Writes ``tokenizer/``, ``text_encoder/`` (seed ``seed``) and ``vae/`` (seed ``seed + 2``) into ``folder``."""
    from diffusers import AutoencoderKL
    from transformers import Qwen3Config, Qwen3Model

    tokenizer = build_qwen3_tokenizer()
    tokenizer.save_pretrained(folder / "tokenizer")
    token = tokenizer.convert_tokens_to_ids
    config = Qwen3Config(
        vocab_size=padded(len(tokenizer)), hidden_size=TEXT_HIDDEN_SIZE, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=1024,
        bos_token_id=token("<|endoftext|>"), eos_token_id=token("<|im_end|>"), pad_token_id=token("<|endoftext|>"),
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    )  # fmt: skip
    with seeded(seed):
        text_encoder = Qwen3Model(config)
    text_encoder.save_pretrained(folder / "text_encoder", max_shard_size=SHARD_SIZE)
    with seeded(seed + 2):
        vae = AutoencoderKL(
            in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(8, 16, 16, 16), layers_per_block=1,
            down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
            norm_num_groups=8, scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
            use_post_quant_conv=False, force_upcast=True,
        )  # fmt: skip
    vae.save_pretrained(folder / "vae")


def _shared_parts(root: Path, seed: int) -> Path:
    """The folder holding the shared parts for ``seed`` under ``root``, written on first use."""
    folder = Path(root) / _SHARED_CACHE / f"seed-{seed}"
    if not (folder / "vae" / "config.json").is_file():
        partial = folder.with_name(folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        _write_shared(partial, seed)
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
    return folder


def _link_tree(source: Path, target: Path) -> None:
    """Hard-links every file of ``source`` into ``target`` (a copy where the file system refuses links)."""
    for path in source.rglob("*"):
        if path.is_file():
            destination = target / path.relative_to(source)
            destination.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, destination)
            except OSError:
                shutil.copy2(path, destination)


def build_tiny_z_image(root: Path, model_id: str = Z_IMAGE_TURBO_MODEL_ID, seed: int = 0) -> Path:
    """Writes a tiny Z-Image repo (``Tongyi-MAI/Z-Image`` or ``Tongyi-MAI/Z-Image-Turbo``) at ``root/<model_id>``.

    Layout: ``transformer/`` (ZImageTransformer2DModel, sharded), ``text_encoder/`` (Qwen3Model, sharded),
    ``tokenizer/``, ``vae/`` (AutoencoderKL, one file), ``scheduler/`` and ``model_index.json``. Weights are float32.

    Raises:
        ValueError: ``model_id`` is not one of the two releases.
    """
    from diffusers import ZImageTransformer2DModel

    if model_id not in TRANSFORMER_SEEDS:
        raise ValueError(f"model_id={model_id!r} is not a Z-Image release; choose from {sorted(TRANSFORMER_SEEDS)}")
    repo = prepare_repo(root, model_id)
    shared = _shared_parts(root, seed)
    for name in _SHARED_FOLDERS:
        _link_tree(shared / name, repo / name)
    with seeded(seed + TRANSFORMER_SEEDS[model_id]):
        transformer = ZImageTransformer2DModel(**TRANSFORMER_CONFIG)
    transformer.save_pretrained(repo / "transformer", max_shard_size=SHARD_SIZE)
    write_json(repo / "scheduler" / "scheduler_config.json", Z_IMAGE_SCHEDULER_CONFIGS[model_id])
    write_json(repo / "model_index.json", model_index("ZImagePipeline", _COMPONENTS))
    return repo


Z_IMAGE_BUILDERS = {
    "z_image": functools.partial(build_tiny_z_image, model_id=Z_IMAGE_MODEL_ID),
    "z_image_turbo": functools.partial(build_tiny_z_image, model_id=Z_IMAGE_TURBO_MODEL_ID),
}
