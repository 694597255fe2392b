"""Tiny random-weight Z-Image repos (``Tongyi-MAI/Z-Image``, ``Tongyi-MAI/Z-Image-Turbo`` and
``Tongyi-MAI/Z-Image-Omni-Base``) in the released diffusers layout.

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

Z-Image-Omni-Base adds what diffusers' ``ZImageOmniPipeline`` loads: a transformer with ``siglip_feat_dim`` (its
SigLIP embedder and refiner), ``siglip/`` (a transformers ``Siglip2VisionModel`` in one ``model.safetensors``, the file
the reference's commands name) and ``siglip_processor/`` (the ``Siglip2ImageProcessor``'s
``preprocessor_config.json``, written directly so that nothing is downloaded); its ``model_index.json`` names
``ZImageOmniPipeline``. The scheduler is the base model's (static shift 6): the pipeline's resolution-dependent ``mu``
only acts under dynamic shifting, which the tiny repo leaves off as the other Z-Image releases do.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

from .tiny_common import SHARD_SIZE, model_index, padded, prepare_repo, seeded, write_json

Z_IMAGE_MODEL_ID = "Tongyi-MAI/Z-Image"
Z_IMAGE_TURBO_MODEL_ID = "Tongyi-MAI/Z-Image-Turbo"
Z_IMAGE_OMNI_MODEL_ID = "Tongyi-MAI/Z-Image-Omni-Base"

# Patterns that select each component, as the reference's commands give them to --model_id_with_origin_paths.
Z_IMAGE_PATTERNS = {
    "dit": "transformer/*.safetensors",
    "text_encoder": "text_encoder/*.safetensors",
    "vae": "vae/diffusion_pytorch_model.safetensors",
    "tokenizer": "tokenizer/",
    "siglip": "siglip/model.safetensors",
}

# scheduler/scheduler_config.json of each release: flow-match Euler with a static shift, no dynamic shifting.
Z_IMAGE_SCHEDULER_CONFIGS = {
    Z_IMAGE_TURBO_MODEL_ID: {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000,
                             "shift": 3.0, "use_dynamic_shifting": False},
    Z_IMAGE_MODEL_ID: {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000,
                       "shift": 6.0, "use_dynamic_shifting": False},
    Z_IMAGE_OMNI_MODEL_ID: {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000,
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
TRANSFORMER_SEEDS = {Z_IMAGE_MODEL_ID: 1, Z_IMAGE_TURBO_MODEL_ID: 3, Z_IMAGE_OMNI_MODEL_ID: 4}
# The Omni transformer's SigLIP width is the vision model's hidden size; the SigLIP model takes seed + 5.
SIGLIP_HIDDEN_SIZE = 24
SIGLIP_SEED = 5
SIGLIP_CONFIG = {
    "hidden_size": SIGLIP_HIDDEN_SIZE, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_channels": 3, "patch_size": 8, "num_patches": 16,
}  # fmt: skip
# Siglip2ImageProcessor's options as a release writes them; patch_size must be the vision model's. A small
# max_num_patches keeps the tiny model's sequence short (the processor resizes each image to at most that many).
SIGLIP_PROCESSOR_CONFIG = {
    "image_processor_type": "Siglip2ImageProcessor", "do_resize": True, "resample": 2, "do_rescale": True,
    "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "do_convert_rgb": None, "patch_size": 8, "max_num_patches": 64,
}  # fmt: skip

_COMPONENTS = {
    "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
    "text_encoder": ("transformers", "Qwen3Model"),
    "tokenizer": ("transformers", "Qwen2Tokenizer"),
    "transformer": ("diffusers", "ZImageTransformer2DModel"),
    "vae": ("diffusers", "AutoencoderKL"),
}
_OMNI_COMPONENTS = {
    **_COMPONENTS, "siglip": ("transformers", "Siglip2VisionModel"),
    "siglip_processor": ("transformers", "Siglip2ImageProcessor"),
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


def _write_siglip(repo: Path, seed: int) -> None:
    """Writes ``siglip/`` (a ``Siglip2VisionModel``, one ``model.safetensors``) and ``siglip_processor/``."""
    from transformers import Siglip2VisionConfig, Siglip2VisionModel

    with seeded(seed):
        siglip = Siglip2VisionModel(Siglip2VisionConfig(**SIGLIP_CONFIG))
    # A shard limit above the model's size keeps it in the single file the reference's pattern names.
    siglip.save_pretrained(repo / "siglip", max_shard_size="1GB")
    write_json(repo / "siglip_processor" / "preprocessor_config.json", SIGLIP_PROCESSOR_CONFIG)


def build_tiny_z_image(root: Path, model_id: str = Z_IMAGE_TURBO_MODEL_ID, seed: int = 0) -> Path:
    """Writes a tiny Z-Image repo (``Tongyi-MAI/Z-Image``, ``-Turbo`` or ``-Omni-Base``) at ``root/<model_id>``.

    Layout: ``transformer/`` (ZImageTransformer2DModel, sharded), ``text_encoder/`` (Qwen3Model, sharded),
    ``tokenizer/``, ``vae/`` (AutoencoderKL, one file), ``scheduler/`` and ``model_index.json``; Omni-Base adds
    ``siglip/`` and ``siglip_processor/``. Weights are float32.

    Raises:
        ValueError: ``model_id`` is not one of the three releases.
    """
    from diffusers import ZImageTransformer2DModel

    if model_id not in TRANSFORMER_SEEDS:
        raise ValueError(f"model_id={model_id!r} is not a Z-Image release; choose from {sorted(TRANSFORMER_SEEDS)}")
    repo = prepare_repo(root, model_id)
    shared = _shared_parts(root, seed)
    for name in _SHARED_FOLDERS:
        _link_tree(shared / name, repo / name)
    omni = model_id == Z_IMAGE_OMNI_MODEL_ID
    config = {**TRANSFORMER_CONFIG, "siglip_feat_dim": SIGLIP_HIDDEN_SIZE} if omni else TRANSFORMER_CONFIG
    with seeded(seed + TRANSFORMER_SEEDS[model_id]):
        transformer = ZImageTransformer2DModel(**config)
    transformer.save_pretrained(repo / "transformer", max_shard_size=SHARD_SIZE)
    write_json(repo / "scheduler" / "scheduler_config.json", Z_IMAGE_SCHEDULER_CONFIGS[model_id])
    if omni:
        _write_siglip(repo, seed + SIGLIP_SEED)
        write_json(repo / "model_index.json", model_index("ZImageOmniPipeline", _OMNI_COMPONENTS))
    else:
        write_json(repo / "model_index.json", model_index("ZImagePipeline", _COMPONENTS))
    return repo


Z_IMAGE_BUILDERS = {
    "z_image": functools.partial(build_tiny_z_image, model_id=Z_IMAGE_MODEL_ID),
    "z_image_turbo": functools.partial(build_tiny_z_image, model_id=Z_IMAGE_TURBO_MODEL_ID),
    "z_image_omni_base": functools.partial(build_tiny_z_image, model_id=Z_IMAGE_OMNI_MODEL_ID),
}
