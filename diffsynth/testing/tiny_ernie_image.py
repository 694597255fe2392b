"""Tiny random-weight ERNIE-Image repos (``PaddlePaddle/ERNIE-Image``, ``PaddlePaddle/ERNIE-Image-Turbo``) in the
released diffusers layout.

Each repo holds ``transformer/`` (``ErnieImageTransformer2DModel``, sharded), ``text_encoder/model.safetensors`` (a
``Mistral3Model`` with a Ministral-3 language model and a Pixtral vision tower, one file as the reference's pattern
names it; transformers 5 writes its language model under ``language_model.model.``, the released layout), ``tokenizer/`` (the byte-level Qwen tokenizer of the other tiny repos), ``vae/`` (``AutoencoderKLFlux2``
with random batch-norm statistics), ``scheduler/`` (static shift 3) and ``model_index.json`` naming
``ErnieImagePipeline``. The two repos share the text encoder, tokenizer and VAE; each has its own transformer.

diffusers initialises the transformer's modulation and output layers at zero; they are drawn at random here, so that
the tests see every part of the computation.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from .tiny_common import SHARD_SIZE, model_index, padded, prepare_repo, seeded, write_json

ERNIE_IMAGE_MODEL_ID = "PaddlePaddle/ERNIE-Image"
ERNIE_IMAGE_TURBO_MODEL_ID = "PaddlePaddle/ERNIE-Image-Turbo"

# The reference's --model_id_with_origin_paths patterns, by pipeline slot.
ERNIE_IMAGE_PATTERNS = {
    "dit": "transformer/diffusion_pytorch_model*.safetensors",
    "text_encoder": "text_encoder/model.safetensors",
    "vae": "vae/diffusion_pytorch_model.safetensors",
    "tokenizer": "tokenizer/",
}
TEXT_HIDDEN_SIZE = 32
TRANSFORMER_CONFIG = {
    "hidden_size": 32, "num_attention_heads": 2, "num_layers": 2, "ffn_hidden_size": 64, "in_channels": 128,
    "out_channels": 128, "text_in_dim": TEXT_HIDDEN_SIZE, "rope_axes_dim": (4, 6, 6),
}  # fmt: skip
TRANSFORMER_SEEDS = {ERNIE_IMAGE_MODEL_ID: 8, ERNIE_IMAGE_TURBO_MODEL_ID: 9}
SCHEDULER_CONFIG = {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 3.0,
                    "use_dynamic_shifting": False}
_COMPONENTS = {
    "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
    "text_encoder": ("transformers", "Mistral3Model"),
    "tokenizer": ("transformers", "Qwen2Tokenizer"),
    "transformer": ("diffusers", "ErnieImageTransformer2DModel"),
    "vae": ("diffusers", "AutoencoderKLFlux2"),
}


def _write_shared(repo: Path, seed: int) -> None:
    """``tokenizer/``, ``text_encoder/`` (seed ``seed + 5``) and ``vae/`` (seed ``seed + 6``)."""
    from diffusers import AutoencoderKLFlux2
    from transformers import Mistral3Config, Mistral3Model

    from .tiny_models import build_qwen_tokenizer  # imported here: tiny_models imports this module for BUILDERS

    tokenizer = build_qwen_tokenizer()
    tokenizer.save_pretrained(repo / "tokenizer")
    text_config = {
        "model_type": "ministral3", "hidden_size": TEXT_HIDDEN_SIZE, "intermediate_size": 64, "num_hidden_layers": 3,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "vocab_size": padded(len(tokenizer)),
        "max_position_embeddings": 1024,
        # Ministral-3's YaRN rope with Llama-4 attention scaling, as released, scaled down.
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0,
                            "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
                            "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1},
    }  # fmt: skip
    vision_config = {"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "head_dim": 16, "patch_size": 4, "image_size": 32}
    with seeded(seed + 5):
        encoder = Mistral3Model(Mistral3Config(text_config=text_config, vision_config=vision_config,
                                               image_token_index=tokenizer.convert_tokens_to_ids("<|image_pad|>"),
                                               spatial_merge_size=2, multimodal_projector_bias=False))
    # A shard limit above the model's size keeps it in the one file the reference's pattern names.
    encoder.save_pretrained(repo / "text_encoder", max_shard_size="1GB")
    with seeded(seed + 6):
        vae = AutoencoderKLFlux2(block_out_channels=(8, 16, 16, 16), layers_per_block=1, norm_num_groups=8,
                                 latent_channels=32)
        vae.bn.running_mean.copy_(torch.randn_like(vae.bn.running_mean) * 0.1)
        vae.bn.running_var.copy_(torch.rand_like(vae.bn.running_var) + 0.5)
    vae.save_pretrained(repo / "vae")


def build_tiny_ernie_image(root: Path, model_id: str = ERNIE_IMAGE_MODEL_ID, seed: int = 0) -> Path:
    """Writes a tiny ERNIE-Image repo (``PaddlePaddle/ERNIE-Image`` or ``-Turbo``) at ``root/<model_id>``. Weights are
    float32.

    Raises:
        ValueError: ``model_id`` is not one of the two releases.
    """
    from diffusers import ErnieImageTransformer2DModel

    if model_id not in TRANSFORMER_SEEDS:
        raise ValueError(f"model_id={model_id!r} is not an ERNIE-Image release; choose from "
                         f"{sorted(TRANSFORMER_SEEDS)}")
    repo = prepare_repo(root, model_id)
    _write_shared(repo, seed)
    with seeded(seed + TRANSFORMER_SEEDS[model_id]):
        transformer = ErnieImageTransformer2DModel(**TRANSFORMER_CONFIG)
        for module in (transformer.adaLN_modulation[-1], transformer.final_linear):
            torch.nn.init.normal_(module.weight, std=0.1)
            torch.nn.init.normal_(module.bias, std=0.1)
    transformer.save_pretrained(repo / "transformer", max_shard_size=SHARD_SIZE)
    write_json(repo / "scheduler" / "scheduler_config.json", SCHEDULER_CONFIG)
    write_json(repo / "model_index.json", model_index("ErnieImagePipeline", _COMPONENTS, pe=[None, None],
                                                      pe_tokenizer=[None, None]))
    return repo


ERNIE_IMAGE_BUILDERS = {
    "ernie_image": functools.partial(build_tiny_ernie_image, model_id=ERNIE_IMAGE_MODEL_ID),
    "ernie_image_turbo": functools.partial(build_tiny_ernie_image, model_id=ERNIE_IMAGE_TURBO_MODEL_ID),
}
