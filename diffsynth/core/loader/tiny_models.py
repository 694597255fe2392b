"""Tiny random-weight Qwen-Image (text-to-image and the three Edit versions) and Wan (text- and image-to-video) repos,
written in the real repositories' layout.

The models are the real diffusers / transformers classes with tiny configs, saved the way the real diffusers repos
are (sharded safetensors with an index, ``config.json`` per component, ``tokenizer/``, ``scheduler/`` and a root
``model_index.json``), so both this package's loader and diffusers' own ``QwenImagePipeline.from_pretrained`` /
``WanPipeline.from_pretrained`` / ``WanImageToVideoPipeline.from_pretrained`` read them. They build in about a
second and are identical for a given seed.

No tokenizer files exist offline, so the tokenizers are built from scratch: a byte-level BPE ``Qwen2Tokenizer``
without merges (one token per byte, plus the Qwen chat/vision special tokens) and a small unigram ``T5Tokenizer``. The
Edit repos' ``processor/`` folder (the Qwen2.5-VL processor) is that tokenizer plus the real repositories' image and
video preprocessing settings, written as JSON: building the video processor itself needs torchvision.

CLI::

    python -m diffsynth.core.loader.tiny_models --output ./models
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import shutil
from pathlib import Path

import torch

QWEN_IMAGE_MODEL_ID = "Qwen/Qwen-Image"
QWEN_IMAGE_EDIT_MODEL_ID = "Qwen/Qwen-Image-Edit"
QWEN_IMAGE_EDIT_2509_MODEL_ID = "Qwen/Qwen-Image-Edit-2509"
QWEN_IMAGE_EDIT_2511_MODEL_ID = "Qwen/Qwen-Image-Edit-2511"
WAN_MODEL_ID = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
WAN_I2V_MODEL_ID = "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers"
TINY_MARKER = ".diffsynth_tiny_model"

# Patterns that select each component of the repos written here, as given to --model_id_with_origin_paths.
QWEN_IMAGE_PATTERNS = {
    "dit": "transformer/diffusion_pytorch_model*.safetensors",
    "text_encoder": "text_encoder/model*.safetensors",
    "vae": "vae/diffusion_pytorch_model.safetensors",
    "tokenizer": "tokenizer/",
}
QWEN_IMAGE_EDIT_PATTERNS = {**QWEN_IMAGE_PATTERNS, "processor": "processor/"}
WAN_PATTERNS = {
    "dit": "transformer/diffusion_pytorch_model*.safetensors",
    "text_encoder": "text_encoder/model*.safetensors",
    "vae": "vae/diffusion_pytorch_model.safetensors",
    "tokenizer": "tokenizer/",
}
WAN_I2V_PATTERNS = {
    **WAN_PATTERNS,
    "image_encoder": "image_encoder/model*.safetensors",
    "image_processor": "image_processor/",
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
# scheduler/scheduler_config.json of Wan-AI/Wan2.1-T2V-1.3B-Diffusers (UniPC in flow-prediction mode, shift 3).
WAN_SCHEDULER_CONFIG = {
    "_class_name": "UniPCMultistepScheduler",
    "beta_end": 0.02,
    "beta_schedule": "linear",
    "beta_start": 0.0001,
    "disable_corrector": [],
    "dynamic_thresholding_ratio": 0.995,
    "final_sigmas_type": "zero",
    "flow_shift": 3.0,
    "lower_order_final": True,
    "num_train_timesteps": 1000,
    "predict_x0": True,
    "prediction_type": "flow_prediction",
    "rescale_betas_zero_snr": False,
    "sample_max_value": 1.0,
    "solver_order": 2,
    "solver_p": None,
    "solver_type": "bh2",
    "steps_offset": 0,
    "thresholding": False,
    "timestep_spacing": "linspace",
    "trained_betas": None,
    "use_beta_sigmas": False,
    "use_exponential_sigmas": False,
    "use_flow_sigmas": True,
    "use_karras_sigmas": False,
}
# image_processor/preprocessor_config.json of the Wan2.1 I2V repositories (CLIP ViT-H/14 preprocessing), with the
# 224-pixel resize and crop shrunk to the tiny image encoder's image_size.
TINY_CLIP_IMAGE_SIZE = 32
WAN_I2V_IMAGE_PROCESSOR_CONFIG = {
    "crop_size": {"height": TINY_CLIP_IMAGE_SIZE, "width": TINY_CLIP_IMAGE_SIZE},
    "do_center_crop": True,
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "CLIPImageProcessor",
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"shortest_edge": TINY_CLIP_IMAGE_SIZE},
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
# Shard limits small enough that each sharded component is written in at least two files, like the real repos.
_SHARD_SIZE = "100KB"


@contextlib.contextmanager
def _seeded(seed: int):
    """Seeds torch's global generator for one component without disturbing the caller's random state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")


def _prepare_repo(root: Path, model_id: str) -> Path:
    """Creates an empty repo folder; refuses to delete a folder this module did not write (it may hold real weights)."""
    repo = Path(root) / model_id
    if repo.exists():
        if not (repo / TINY_MARKER).is_file():
            raise FileExistsError(
                f"{repo} exists and is not a tiny model written by this module (no {TINY_MARKER}); it may hold the "
                "real weights. Choose another --output folder, or delete it yourself"
            )
        shutil.rmtree(repo)
    repo.mkdir(parents=True)
    (repo / TINY_MARKER).write_text("random-weight test model written by diffsynth.core.loader.tiny_models\n")
    return repo


def _model_index(pipeline: str, components: dict[str, tuple[str, str]]) -> dict:
    import diffusers

    index = {"_class_name": pipeline, "_diffusers_version": diffusers.__version__}
    index.update({name: [library, cls] for name, (library, cls) in components.items()})
    return index


def build_qwen_tokenizer():
    """A byte-level ``Qwen2Tokenizer``: one token per byte, ``<|endoftext|>`` and the chat/vision special tokens."""
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {char: index for index, char in enumerate(bytes_to_unicode().values())}
    vocab["<|endoftext|>"] = len(vocab)
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[])
    tokenizer.add_special_tokens({"additional_special_tokens": list(QWEN_SPECIAL_TOKENS)})
    return tokenizer


def build_t5_tokenizer():
    """A small unigram ``T5Tokenizer``: pad/eos/unk, the word-start piece, letters, digits and a few words."""
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    pieces += [(char, -4.0) for char in "abcdefghijklmnopqrstuvwxyz0123456789.,!?'-"]
    words = ("a", "the", "of", "and", "in", "on", "with", "cat", "dog", "man", "woman", "red", "blue", "photo", "video")
    pieces += [("\u2581" + word, -3.0) for word in words]
    return T5Tokenizer(vocab=pieces, extra_ids=0)


def _padded(size: int, multiple: int = 8) -> int:
    return (size + multiple - 1) // multiple * multiple


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
        "num_key_value_heads": 1, "vocab_size": _padded(len(tokenizer)),
        "bos_token_id": token("<|endoftext|>"), "eos_token_id": token("<|im_end|>"),
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]},
    }  # fmt: skip
    vision_config = {
        "depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": hidden,
        "fullatt_block_indexes": [0],
    }  # fmt: skip
    with _seeded(seed):
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
    text_encoder.save_pretrained(repo / "text_encoder", max_shard_size=_SHARD_SIZE)
    with _seeded(seed + 2):
        vae = AutoencoderKLQwenImage(
            base_dim=16, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1, temperal_downsample=[False, True, True],
            latents_mean=[round(-0.4 + 0.05 * i, 2) for i in range(16)],
            latents_std=[round(0.6 + 0.05 * i, 2) for i in range(16)],
        )  # fmt: skip
    vae.save_pretrained(repo / "vae")
    _write_json(repo / "scheduler" / "scheduler_config.json", QWEN_IMAGE_SCHEDULER_CONFIG)
    return hidden


def _write_qwen_image_transformer(repo: Path, seed: int, joint_attention_dim: int, zero_cond_t: bool = False) -> None:
    """Writes a tiny sharded ``transformer/`` (QwenImageTransformer2DModel)."""
    from diffusers import QwenImageTransformer2DModel

    with _seeded(seed):
        transformer = QwenImageTransformer2DModel(
            patch_size=2, in_channels=64, out_channels=16, num_layers=2, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=joint_attention_dim, guidance_embeds=False,
            axes_dims_rope=(8, 4, 4), zero_cond_t=zero_cond_t,
        )  # fmt: skip
    transformer.save_pretrained(repo / "transformer", max_shard_size=_SHARD_SIZE)


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
    repo = _prepare_repo(root, model_id)
    hidden = _write_qwen_image_shared(repo, seed)
    _write_qwen_image_transformer(repo, seed + 1, hidden)
    _write_json(repo / "model_index.json", _model_index("QwenImagePipeline", _QWEN_IMAGE_COMPONENTS))
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
    repo = _prepare_repo(root, model_id)
    hidden = _write_qwen_image_shared(repo, seed)
    _write_qwen_image_transformer(repo, seed + transformer_seed, hidden, zero_cond_t=zero_cond_t)
    build_qwen_tokenizer().save_pretrained(repo / "processor")
    _write_json(repo / "processor" / "preprocessor_config.json", QWEN_VL_PREPROCESSOR_CONFIG)
    _write_json(repo / "processor" / "video_preprocessor_config.json", QWEN_VL_VIDEO_PREPROCESSOR_CONFIG)
    components = {**_QWEN_IMAGE_COMPONENTS, "processor": ("transformers", "Qwen2VLProcessor")}
    _write_json(repo / "model_index.json", _model_index(pipeline, components))
    return repo


def _write_wan_shared(repo: Path, seed: int) -> int:
    """Writes what the Wan text- and image-to-video repos share: ``tokenizer/``, ``text_encoder/``, ``vae/`` and
    ``scheduler/``; returns the text encoder's width (the transformer's ``text_dim``).

    Seeds: ``seed`` for the text encoder, ``seed + 2`` for the VAE (``seed + 1`` is the caller's transformer).
    """
    from diffusers import AutoencoderKLWan
    from transformers import UMT5Config, UMT5EncoderModel

    tokenizer = build_t5_tokenizer()
    tokenizer.save_pretrained(repo / "tokenizer")
    text_dim = 32
    with _seeded(seed):
        text_encoder = UMT5EncoderModel(
            UMT5Config(
                vocab_size=_padded(len(tokenizer)), d_model=text_dim, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                relative_attention_num_buckets=8, relative_attention_max_distance=16, feed_forward_proj="gated-gelu",
                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=0,
            )
        )  # fmt: skip
    text_encoder.save_pretrained(repo / "text_encoder", max_shard_size="50KB")
    with _seeded(seed + 2):
        vae = AutoencoderKLWan(
            base_dim=16, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1, temperal_downsample=[False, True, True]
        )
    vae.save_pretrained(repo / "vae")
    _write_json(repo / "scheduler" / "scheduler_config.json", WAN_SCHEDULER_CONFIG)
    return text_dim


def _write_wan_transformer(repo: Path, seed: int, text_dim: int, in_channels: int = 16, image_dim: int | None = None,
                           added_kv_proj_dim: int | None = None) -> None:
    """Writes a tiny sharded ``transformer/`` (WanTransformer3DModel); the last three arguments make it an I2V one."""
    from diffusers import WanTransformer3DModel

    with _seeded(seed):
        transformer = WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=in_channels,
            out_channels=16, text_dim=text_dim, freq_dim=32, ffn_dim=64, num_layers=2, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", rope_max_seq_len=32, image_dim=image_dim,
            added_kv_proj_dim=added_kv_proj_dim,
        )  # fmt: skip
    transformer.save_pretrained(repo / "transformer", max_shard_size=_SHARD_SIZE)


_WAN_COMPONENTS = {
    "scheduler": ("diffusers", "UniPCMultistepScheduler"),
    "text_encoder": ("transformers", "UMT5EncoderModel"),
    "tokenizer": ("transformers", "T5TokenizerFast"),
    "transformer": ("diffusers", "WanTransformer3DModel"),
    "vae": ("diffusers", "AutoencoderKLWan"),
}


def build_tiny_wan(root: Path, model_id: str = WAN_MODEL_ID, seed: int = 0) -> Path:
    """Writes a tiny Wan2.1 text-to-video repo at ``root/<model_id>`` and returns its folder.

    Layout: ``transformer/`` (WanTransformer3DModel, sharded), ``vae/`` (AutoencoderKLWan, one file),
    ``text_encoder/`` (UMT5EncoderModel, sharded; ``shared.weight`` and ``encoder.embed_tokens.weight`` are tied, so
    only the first is stored), ``tokenizer/``, ``scheduler/`` and ``model_index.json``. Weights are float32.
    """
    repo = _prepare_repo(root, model_id)
    text_dim = _write_wan_shared(repo, seed)
    _write_wan_transformer(repo, seed + 1, text_dim)
    _write_json(repo / "model_index.json", _model_index("WanPipeline", _WAN_COMPONENTS))
    return repo


def build_tiny_wan_i2v(root: Path, model_id: str = WAN_I2V_MODEL_ID, seed: int = 0) -> Path:
    """Writes a tiny Wan2.1 image-to-video repo at ``root/<model_id>`` and returns its folder.

    The text-to-video layout (see ``build_tiny_wan``) plus ``image_encoder/`` (CLIPVisionModel, one file) and
    ``image_processor/`` (CLIPImageProcessor settings), with a transformer that takes the image: ``in_channels=36``
    (16 noisy latents + 4 mask + 16 condition latents), ``image_dim`` equal to the image encoder's width and
    ``added_kv_proj_dim`` equal to the transformer's own width, as in ``Wan-AI/Wan2.1-I2V-14B-480P-Diffusers``.
    Weights are float32; ``model_index.json`` names ``WanImageToVideoPipeline``.
    """
    from transformers import CLIPVisionConfig, CLIPVisionModel

    repo = _prepare_repo(root, model_id)
    text_dim = _write_wan_shared(repo, seed)
    image_dim = 32
    with _seeded(seed + 3):
        image_encoder = CLIPVisionModel(
            CLIPVisionConfig(
                hidden_size=image_dim, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                image_size=TINY_CLIP_IMAGE_SIZE, patch_size=8, projection_dim=image_dim,
            )
        )  # fmt: skip
    image_encoder.save_pretrained(repo / "image_encoder")
    _write_json(repo / "image_processor" / "preprocessor_config.json", WAN_I2V_IMAGE_PROCESSOR_CONFIG)
    # added_kv_proj_dim is the transformer's inner width (heads x head dim), as in the released I2V configs.
    _write_wan_transformer(repo, seed + 1, text_dim, in_channels=36, image_dim=image_dim, added_kv_proj_dim=32)
    components = {
        **_WAN_COMPONENTS,
        "image_encoder": ("transformers", "CLIPVisionModel"),
        "image_processor": ("transformers", "CLIPImageProcessor"),
    }
    _write_json(repo / "model_index.json", _model_index("WanImageToVideoPipeline", components))
    return repo


BUILDERS = {
    "qwen_image": build_tiny_qwen_image,
    "qwen_image_edit": functools.partial(build_tiny_qwen_image_edit, model_id=QWEN_IMAGE_EDIT_MODEL_ID),
    "qwen_image_edit_2509": functools.partial(build_tiny_qwen_image_edit, model_id=QWEN_IMAGE_EDIT_2509_MODEL_ID),
    "qwen_image_edit_2511": functools.partial(build_tiny_qwen_image_edit, model_id=QWEN_IMAGE_EDIT_2511_MODEL_ID),
    "wan": build_tiny_wan,
    "wan_i2v": build_tiny_wan_i2v,
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
