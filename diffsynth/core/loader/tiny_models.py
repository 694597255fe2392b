"""Tiny random-weight Qwen-Image and Wan repos, written in the real repositories' layouts.

The models are the real diffusers / transformers classes with tiny configs, saved the way the real diffusers repos
are (sharded safetensors with an index, ``config.json`` per component, ``tokenizer/``, ``scheduler/`` and a root
``model_index.json``), so both this package's loader and diffusers' own ``QwenImagePipeline.from_pretrained`` /
``WanPipeline.from_pretrained`` / ``WanImageToVideoPipeline.from_pretrained`` read them. The Wan repos are also
written in the original Wan release layouts (``tiny_wan.py``). They build in a few seconds and are identical for a
given seed.

No tokenizer files exist offline, so the tokenizers are built from scratch: a byte-level BPE ``Qwen2Tokenizer``
without merges (one token per byte, plus the Qwen chat/vision special tokens) and a small unigram ``T5Tokenizer``.

CLI::

    python -m diffsynth.core.loader.tiny_models --output ./models
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .tiny_common import SHARD_SIZE, TINY_MARKER, model_index, padded, prepare_repo, seeded, write_json
from .tiny_wan import (WAN22_I2V_MODEL_ID, WAN22_T2V_MODEL_ID, WAN22_TI2V_MODEL_ID, WAN22_A14B_PATTERNS,
                       WAN22_TI2V_PATTERNS, WAN_BUILDERS, WAN_I2V_IMAGE_PROCESSOR_CONFIG, WAN_I2V_MODEL_ID,
                       WAN_I2V_ORIGINAL_MODEL_ID, WAN_I2V_ORIGINAL_PATTERNS, WAN_I2V_PATTERNS, WAN_MODEL_ID,
                       WAN_ORIGINAL_MODEL_ID, WAN_ORIGINAL_PATTERNS, WAN_PATTERNS, WAN_SCHEDULER_CONFIG,
                       build_t5_tokenizer, build_tiny_wan, build_tiny_wan_i2v)

# The Wan names are re-exported: tests and scripts import every tiny repo's id and patterns from this module.
__all__ = [
    "BUILDERS", "QWEN_IMAGE_MODEL_ID", "QWEN_IMAGE_PATTERNS", "QWEN_IMAGE_SCHEDULER_CONFIG", "TINY_MARKER",
    "WAN22_A14B_PATTERNS", "WAN22_I2V_MODEL_ID", "WAN22_T2V_MODEL_ID", "WAN22_TI2V_MODEL_ID", "WAN22_TI2V_PATTERNS",
    "WAN_I2V_IMAGE_PROCESSOR_CONFIG", "WAN_I2V_MODEL_ID", "WAN_I2V_ORIGINAL_MODEL_ID", "WAN_I2V_ORIGINAL_PATTERNS",
    "WAN_I2V_PATTERNS", "WAN_MODEL_ID", "WAN_ORIGINAL_MODEL_ID", "WAN_ORIGINAL_PATTERNS", "WAN_PATTERNS",
    "WAN_SCHEDULER_CONFIG", "build_qwen_tokenizer", "build_t5_tokenizer", "build_tiny_models", "build_tiny_qwen_image",
    "build_tiny_wan", "build_tiny_wan_i2v", "main",
]

QWEN_IMAGE_MODEL_ID = "Qwen/Qwen-Image"

# Patterns that select each component of the repos written here, as given to --model_id_with_origin_paths.
QWEN_IMAGE_PATTERNS = {
    "dit": "transformer/diffusion_pytorch_model*.safetensors",
    "text_encoder": "text_encoder/model*.safetensors",
    "vae": "vae/diffusion_pytorch_model.safetensors",
    "tokenizer": "tokenizer/",
}

# scheduler/scheduler_config.json of Qwen/Qwen-Image (the released repository's values).
QWEN_IMAGE_SCHEDULER_CONFIG = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "invert_sigmas": False,
    "max_image_seq_len": 8192,
    "max_shift": 0.9,
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "shift_terminal": 0.02,
    "stochastic_sampling": False,
    "time_shift_type": "exponential",
    "use_beta_sigmas": False,
    "use_dynamic_shifting": True,
    "use_exponential_sigmas": False,
    "use_karras_sigmas": False,
}
QWEN_SPECIAL_TOKENS = (
    "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",
)  # fmt: skip


def build_qwen_tokenizer():
    """A byte-level ``Qwen2Tokenizer``: one token per byte, ``<|endoftext|>`` and the chat/vision special tokens."""
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {char: index for index, char in enumerate(bytes_to_unicode().values())}
    vocab["<|endoftext|>"] = len(vocab)
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[])
    tokenizer.add_special_tokens({"additional_special_tokens": list(QWEN_SPECIAL_TOKENS)})
    return tokenizer


def build_tiny_qwen_image(root: Path, model_id: str = QWEN_IMAGE_MODEL_ID, seed: int = 0) -> Path:
    """Writes a tiny Qwen-Image repo at ``root/<model_id>`` and returns its folder.

    Layout: ``transformer/`` (QwenImageTransformer2DModel, sharded), ``vae/`` (AutoencoderKLQwenImage, one file),
    ``text_encoder/`` (Qwen2_5_VLForConditionalGeneration, sharded), ``tokenizer/``, ``scheduler/`` and
    ``model_index.json``. Weights are float32.
    """
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    repo = prepare_repo(root, model_id)
    tokenizer = build_qwen_tokenizer()
    tokenizer.save_pretrained(repo / "tokenizer")
    token = tokenizer.convert_tokens_to_ids
    hidden = 32  # the text encoder's hidden size is the transformer's joint_attention_dim
    text_config = {
        "hidden_size": hidden, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "vocab_size": padded(len(tokenizer)),
        "bos_token_id": token("<|endoftext|>"), "eos_token_id": token("<|im_end|>"),
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]},
    }  # fmt: skip
    vision_config = {
        "depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": hidden,
        "fullatt_block_indexes": [0],
    }  # fmt: skip
    with seeded(seed):
        text_encoder = Qwen2_5_VLForConditionalGeneration(
            Qwen2_5_VLConfig(
                text_config=text_config,
                vision_config=vision_config,
                image_token_id=token("<|image_pad|>"),
                video_token_id=token("<|video_pad|>"),
                vision_start_token_id=token("<|vision_start|>"),
                vision_end_token_id=token("<|vision_end|>"),
            )
        )
    text_encoder.save_pretrained(repo / "text_encoder", max_shard_size=SHARD_SIZE)
    with seeded(seed + 1):
        transformer = QwenImageTransformer2DModel(
            patch_size=2, in_channels=64, out_channels=16, num_layers=2, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=hidden, guidance_embeds=False, axes_dims_rope=(8, 4, 4),
        )  # fmt: skip
    transformer.save_pretrained(repo / "transformer", max_shard_size=SHARD_SIZE)
    with seeded(seed + 2):
        vae = AutoencoderKLQwenImage(
            base_dim=16, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1, temperal_downsample=[False, True, True],
            latents_mean=[round(-0.4 + 0.05 * i, 2) for i in range(16)],
            latents_std=[round(0.6 + 0.05 * i, 2) for i in range(16)],
        )  # fmt: skip
    vae.save_pretrained(repo / "vae")
    write_json(repo / "scheduler" / "scheduler_config.json", QWEN_IMAGE_SCHEDULER_CONFIG)
    components = {
        "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
        "text_encoder": ("transformers", "Qwen2_5_VLForConditionalGeneration"),
        "tokenizer": ("transformers", "Qwen2Tokenizer"),
        "transformer": ("diffusers", "QwenImageTransformer2DModel"),
        "vae": ("diffusers", "AutoencoderKLQwenImage"),
    }
    write_json(repo / "model_index.json", model_index("QwenImagePipeline", components))
    return repo


BUILDERS = {"qwen_image": build_tiny_qwen_image, **WAN_BUILDERS}


def build_tiny_models(root: Path, seed: int = 0, only: tuple[str, ...] | None = None) -> dict[str, Path]:
    """Builds the tiny repos under ``root`` (a ``DIFFSYNTH_MODEL_BASE_PATH``); returns ``{name: repo folder}``.

    Suits a session-scoped pytest fixture: ``build_tiny_models(tmp_path_factory.mktemp("models"))``.
    """
    names = only or tuple(BUILDERS)
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        raise ValueError(f"--only {unknown} is not a tiny model; choose from {sorted(BUILDERS)}")
    return {name: BUILDERS[name](Path(root), seed=seed) for name in names}


def main(argv: list[str] | None = None) -> int:
    """CLI entry: writes the tiny repos under ``--output``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="./models", help="base folder (a DIFFSYNTH_MODEL_BASE_PATH)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument("--only", nargs="+", choices=sorted(BUILDERS), help="build only these repos")
    args = parser.parse_args(argv)
    for name, repo in build_tiny_models(Path(args.output), seed=args.seed, only=args.only).items():
        print(f"{name}: {repo}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
