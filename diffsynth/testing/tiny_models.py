"""Tiny random-weight Qwen-Image (text-to-image and the three Edit versions) and Wan repos, written in the real
repositories' layouts.

The models are the real diffusers / transformers classes with tiny configs, saved the way the real diffusers repos
are (sharded safetensors with an index, ``config.json`` per component, ``tokenizer/``, ``scheduler/`` and a root
``model_index.json``), so both this package's loader and diffusers' own ``QwenImagePipeline.from_pretrained`` /
``WanPipeline.from_pretrained`` / ``WanImageToVideoPipeline.from_pretrained`` read them. The Wan repos are also
written in the original Wan release layouts (``tiny_wan.py``). They build in a few seconds and are identical for a
given seed.

No tokenizer files exist offline, so the tokenizers are built from scratch: a byte-level BPE ``Qwen2Tokenizer``
without merges (one token per byte, plus the Qwen chat/vision special tokens) and a small unigram ``T5Tokenizer``. The
Edit repos' ``processor/`` folder (the Qwen2.5-VL processor) is that tokenizer plus the real repositories' image and
video preprocessing settings, written as JSON: building the video processor itself needs torchvision.

CLI::

    python -m diffsynth.testing.tiny_models --output ./models
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from .tiny_common import SHARD_SIZE, TINY_MARKER, model_index, padded, prepare_repo, seeded, write_json
from .tiny_flux import (
    FLUX1_BUILDERS,
    FLUX1_DEV_MODEL_ID,
    FLUX1_KONTEXT_MODEL_ID,
    FLUX1_KONTEXT_PATTERNS,
    FLUX1_KREA_MODEL_ID,
    FLUX1_KREA_PATTERNS,
    FLUX1_PATTERNS,
    build_tiny_flux1,
)
from .tiny_flux2 import FLUX2_BUILDERS
from .tiny_flux2_dev import build_tiny_flux2_dev
from .tiny_ernie_image import ERNIE_IMAGE_BUILDERS
from .tiny_ideogram4 import IDEOGRAM4_BUILDERS
from .tiny_joyai_image import JOYAI_IMAGE_BUILDERS
from .tiny_krea2 import KREA2_BUILDERS
from .tiny_ltx2 import LTX2_BUILDERS
from .tiny_ltx2_repackage import LTX2_REPACKAGE_BUILDERS
from .tiny_ltx23 import LTX23_BUILDERS
from .tiny_qwen_blockwise import QWEN_BLOCKWISE_BUILDERS
from .tiny_wan import (
    WAN22_A14B_PATTERNS,
    WAN22_I2V_MODEL_ID,
    WAN22_T2V_MODEL_ID,
    WAN22_TI2V_MODEL_ID,
    WAN22_TI2V_PATTERNS,
    WAN_BUILDERS,
    WAN_I2V_IMAGE_PROCESSOR_CONFIG,
    WAN_I2V_MODEL_ID,
    WAN_I2V_ORIGINAL_MODEL_ID,
    WAN_I2V_ORIGINAL_PATTERNS,
    WAN_I2V_PATTERNS,
    WAN_MODEL_ID,
    WAN_ORIGINAL_MODEL_ID,
    WAN_ORIGINAL_PATTERNS,
    WAN_PATTERNS,
    WAN_SCHEDULER_CONFIG,
    build_t5_tokenizer,
    build_tiny_wan,
    build_tiny_wan_i2v,
)
from .tiny_wan_animate import WAN_ANIMATE_BUILDERS
from .tiny_wan_animate2 import WAN_ANIMATE2_BUILDERS
from .tiny_wan_flf2v import WAN_FLF2V_BUILDERS
from .tiny_wan_vace import WAN_VACE_BUILDERS
from .tiny_stable_diffusion import STABLE_DIFFUSION_BUILDERS
from .tiny_z_image import Z_IMAGE_BUILDERS
from .tiny_z_image_controlnet import Z_IMAGE_CONTROLNET_BUILDERS

# The Wan and FLUX.1 names are re-exported: tests and scripts import every tiny repo's id and patterns from here.
__all__ = [
    "BUILDERS", "FLUX1_DEV_MODEL_ID", "FLUX1_KONTEXT_MODEL_ID", "FLUX1_KONTEXT_PATTERNS", "FLUX1_KREA_MODEL_ID",
    "FLUX1_KREA_PATTERNS", "FLUX1_PATTERNS", "QWEN_IMAGE_EDIT_2509_MODEL_ID", "QWEN_IMAGE_EDIT_2511_MODEL_ID",
    "QWEN_IMAGE_EDIT_MODEL_ID", "QWEN_IMAGE_EDIT_PATTERNS", "QWEN_IMAGE_MODEL_ID", "QWEN_IMAGE_PATTERNS",
    "QWEN_IMAGE_SCHEDULER_CONFIG", "QWEN_VL_PREPROCESSOR_CONFIG", "TINY_MARKER",
    "WAN22_A14B_PATTERNS", "WAN22_I2V_MODEL_ID", "WAN22_T2V_MODEL_ID", "WAN22_TI2V_MODEL_ID", "WAN22_TI2V_PATTERNS",
    "WAN_I2V_IMAGE_PROCESSOR_CONFIG", "WAN_I2V_MODEL_ID", "WAN_I2V_ORIGINAL_MODEL_ID", "WAN_I2V_ORIGINAL_PATTERNS",
    "WAN_I2V_PATTERNS", "WAN_MODEL_ID", "WAN_ORIGINAL_MODEL_ID", "WAN_ORIGINAL_PATTERNS", "WAN_PATTERNS",
    "WAN_SCHEDULER_CONFIG", "build_qwen_tokenizer", "build_t5_tokenizer", "build_tiny_flux1", "build_tiny_models",
    "build_tiny_qwen_image", "build_tiny_qwen_image_edit", "build_tiny_wan", "build_tiny_wan_i2v", "main",
]

QWEN_IMAGE_MODEL_ID = "Qwen/Qwen-Image"
QWEN_IMAGE_EDIT_MODEL_ID = "Qwen/Qwen-Image-Edit"
QWEN_IMAGE_EDIT_2509_MODEL_ID = "Qwen/Qwen-Image-Edit-2509"
QWEN_IMAGE_EDIT_2511_MODEL_ID = "Qwen/Qwen-Image-Edit-2511"

# Patterns that select each component of the repos written here, as given to --model_id_with_origin_paths.
QWEN_IMAGE_PATTERNS = {
    "dit": "transformer/diffusion_pytorch_model*.safetensors",
    "text_encoder": "text_encoder/model*.safetensors",
    "vae": "vae/diffusion_pytorch_model.safetensors",
    "tokenizer": "tokenizer/",
}
QWEN_IMAGE_EDIT_PATTERNS = {**QWEN_IMAGE_PATTERNS, "processor": "processor/"}

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
# processor/preprocessor_config.json of the Qwen-Image-Edit repositories (Qwen2.5-VL: 14-pixel patches merged 2x2,
# between 4 and 16384 merged patches per image); video_preprocessor_config.json holds the same numbers.
QWEN_VL_PREPROCESSOR_CONFIG = {
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "Qwen2VLImageProcessor",
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "max_pixels": 12845056,
    "merge_size": 2,
    "min_pixels": 3136,
    "patch_size": 14,
    "processor_class": "Qwen2VLProcessor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "temporal_patch_size": 2,
}
QWEN_VL_VIDEO_PREPROCESSOR_CONFIG = {
    **{key: value for key, value in QWEN_VL_PREPROCESSOR_CONFIG.items() if key != "image_processor_type"},
    "video_processor_type": "Qwen2VLVideoProcessor",
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


def _write_qwen_image_shared(repo: Path, seed: int) -> int:
    """Writes what every Qwen-Image repo shares: ``tokenizer/``, ``text_encoder/``, ``vae/`` and ``scheduler/``;
    returns the text encoder's hidden size (the transformer's ``joint_attention_dim``).

    Seeds: ``seed`` for the text encoder, ``seed + 2`` for the VAE (``seed + 1`` is the text-to-image transformer's).
    The Edit repos pass the same seed, so all Qwen-Image repos hold the same text encoder and VAE, as the real ones do.
    """
    from diffusers import AutoencoderKLQwenImage
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

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
    with seeded(seed + 2):
        vae = AutoencoderKLQwenImage(
            base_dim=16, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1, temperal_downsample=[False, True, True],
            latents_mean=[round(-0.4 + 0.05 * i, 2) for i in range(16)],
            latents_std=[round(0.6 + 0.05 * i, 2) for i in range(16)],
        )  # fmt: skip
    vae.save_pretrained(repo / "vae")
    write_json(repo / "scheduler" / "scheduler_config.json", QWEN_IMAGE_SCHEDULER_CONFIG)
    return hidden


def _write_qwen_image_transformer(repo: Path, seed: int, joint_attention_dim: int, zero_cond_t: bool = False) -> None:
    """Writes a tiny sharded ``transformer/`` (QwenImageTransformer2DModel)."""
    from diffusers import QwenImageTransformer2DModel

    with seeded(seed):
        transformer = QwenImageTransformer2DModel(
            patch_size=2, in_channels=64, out_channels=16, num_layers=2, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=joint_attention_dim, guidance_embeds=False,
            axes_dims_rope=(8, 4, 4), zero_cond_t=zero_cond_t,
        )  # fmt: skip
    transformer.save_pretrained(repo / "transformer", max_shard_size=SHARD_SIZE)


_QWEN_IMAGE_COMPONENTS = {
    "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
    "text_encoder": ("transformers", "Qwen2_5_VLForConditionalGeneration"),
    "tokenizer": ("transformers", "Qwen2Tokenizer"),
    "transformer": ("diffusers", "QwenImageTransformer2DModel"),
    "vae": ("diffusers", "AutoencoderKLQwenImage"),
}


def build_tiny_qwen_image(root: Path, model_id: str = QWEN_IMAGE_MODEL_ID, seed: int = 0) -> Path:
    """Writes a tiny Qwen-Image repo at ``root/<model_id>`` and returns its folder.

    Layout: ``transformer/`` (QwenImageTransformer2DModel, sharded), ``vae/`` (AutoencoderKLQwenImage, one file),
    ``text_encoder/`` (Qwen2_5_VLForConditionalGeneration, sharded), ``tokenizer/``, ``scheduler/`` and
    ``model_index.json``. Weights are float32.
    """
    repo = prepare_repo(root, model_id)
    hidden = _write_qwen_image_shared(repo, seed)
    _write_qwen_image_transformer(repo, seed + 1, hidden)
    write_json(repo / "model_index.json", model_index("QwenImagePipeline", _QWEN_IMAGE_COMPONENTS))
    return repo


# Per Edit version: the diffusers pipeline its model_index.json names, whether its transformer modulates the
# reference-image tokens with timestep 0 (``zero_cond_t``, new in 2511), and the offset of its transformer's seed.
_QWEN_IMAGE_EDIT_VERSIONS = {
    QWEN_IMAGE_EDIT_MODEL_ID: ("QwenImageEditPipeline", False, 10),
    QWEN_IMAGE_EDIT_2509_MODEL_ID: ("QwenImageEditPlusPipeline", False, 11),
    QWEN_IMAGE_EDIT_2511_MODEL_ID: ("QwenImageEditPlusPipeline", True, 12),
}


def build_tiny_qwen_image_edit(root: Path, model_id: str = QWEN_IMAGE_EDIT_MODEL_ID, seed: int = 0) -> Path:
    """Writes a tiny Qwen-Image-Edit repo (``Qwen/Qwen-Image-Edit``, ``-2509`` or ``-2511``) and returns its folder.

    The Qwen-Image layout (see ``build_tiny_qwen_image``; same text encoder and VAE) plus ``processor/`` (tokenizer
    and Qwen2.5-VL preprocessing settings), with a transformer of its own per version; 2511's sets ``zero_cond_t``.
    ``model_index.json`` names ``QwenImageEditPipeline`` (Edit) or ``QwenImageEditPlusPipeline`` (2509, 2511), as
    the released repositories do.
    """
    if model_id not in _QWEN_IMAGE_EDIT_VERSIONS:
        raise ValueError(f"model_id={model_id!r} is not a Qwen-Image-Edit version; choose from "
                         f"{sorted(_QWEN_IMAGE_EDIT_VERSIONS)}")
    pipeline, zero_cond_t, transformer_seed = _QWEN_IMAGE_EDIT_VERSIONS[model_id]
    repo = prepare_repo(root, model_id)
    hidden = _write_qwen_image_shared(repo, seed)
    _write_qwen_image_transformer(repo, seed + transformer_seed, hidden, zero_cond_t=zero_cond_t)
    build_qwen_tokenizer().save_pretrained(repo / "processor")
    write_json(repo / "processor" / "preprocessor_config.json", QWEN_VL_PREPROCESSOR_CONFIG)
    write_json(repo / "processor" / "video_preprocessor_config.json", QWEN_VL_VIDEO_PREPROCESSOR_CONFIG)
    components = {**_QWEN_IMAGE_COMPONENTS, "processor": ("transformers", "Qwen2VLProcessor")}
    write_json(repo / "model_index.json", model_index(pipeline, components))
    return repo


BUILDERS = {
    "qwen_image": build_tiny_qwen_image,
    "qwen_image_edit": functools.partial(build_tiny_qwen_image_edit, model_id=QWEN_IMAGE_EDIT_MODEL_ID),
    "qwen_image_edit_2509": functools.partial(build_tiny_qwen_image_edit, model_id=QWEN_IMAGE_EDIT_2509_MODEL_ID),
    "qwen_image_edit_2511": functools.partial(build_tiny_qwen_image_edit, model_id=QWEN_IMAGE_EDIT_2511_MODEL_ID),
    **WAN_BUILDERS,
    **WAN_FLF2V_BUILDERS,
    **WAN_VACE_BUILDERS,
    **WAN_ANIMATE_BUILDERS,
    **WAN_ANIMATE2_BUILDERS,
    **FLUX1_BUILDERS,
    **FLUX2_BUILDERS,
    "flux2_dev": build_tiny_flux2_dev,
    **Z_IMAGE_BUILDERS,
    **STABLE_DIFFUSION_BUILDERS,
    **Z_IMAGE_CONTROLNET_BUILDERS,
    **QWEN_BLOCKWISE_BUILDERS,
    **LTX2_BUILDERS,
    **LTX2_REPACKAGE_BUILDERS,
    **LTX23_BUILDERS,
    **KREA2_BUILDERS,
    **ERNIE_IMAGE_BUILDERS,
    **IDEOGRAM4_BUILDERS,
    **JOYAI_IMAGE_BUILDERS,
}


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
