"""Tiny random-weight Wan repos, in the diffusers layout and in the original Wan release layouts.

Every repo is built from the same tiny diffusers / transformers models (one seed per component), so an original-layout
repo and its diffusers-layout twin hold the same weights under different names. The original layouts are written the
way the releases are: the DiT's ``config.json`` names ``WanModel`` and its shards use the original module names
(``dit_original_keys``, the inverse of the map the loader reads them with); the text encoder, VAE and CLIP image
encoder are ``torch.save`` files of plain state dicts under the original names; the tokenizer sits in
``google/umt5-xxl/``. Sizes the original files do not record are the releases' (UMT5 positions saturate at 128, the
CLIP tower has 16 heads and exact GELU, the VAE has two residual blocks per stage, RoPE tables of 1024 positions), so
the loader's fixed constants hold for the tiny models too.

Repository file names: ``wan/configs/*.py`` of Wan-Video/Wan2.1 and Wan2.2 (``t5_checkpoint``, ``t5_tokenizer``,
``vae_checkpoint``, ``clip_checkpoint``, ``low_noise_checkpoint`` / ``high_noise_checkpoint``) and the reference's
example commands (DiffSynth-Studio ``examples/wanvideo/model_training/lora/*.sh``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..pipelines.wan_video.original import dit_original_keys, original_dit_config_json
from ..pipelines.wan_video.original_encoders import (
    clip_image_processor_config,
    clip_original_state_dict,
    umt5_original_state_dict,
)
from ..pipelines.wan_video.original_vae import WAN22_LATENTS_MEAN, WAN22_LATENTS_STD, vae_original_keys
from .tiny_common import SHARD_SIZE, model_index, padded, prepare_repo, save_sharded_safetensors, seeded, write_json

WAN_MODEL_ID = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
WAN_I2V_MODEL_ID = "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers"
WAN_ORIGINAL_MODEL_ID = "Wan-AI/Wan2.1-T2V-1.3B"
WAN_I2V_ORIGINAL_MODEL_ID = "Wan-AI/Wan2.1-I2V-14B-480P"
WAN22_T2V_MODEL_ID = "Wan-AI/Wan2.2-T2V-A14B"
WAN22_I2V_MODEL_ID = "Wan-AI/Wan2.2-I2V-A14B"
WAN22_TI2V_MODEL_ID = "Wan-AI/Wan2.2-TI2V-5B"

# Patterns that select each component, as given to --model_id_with_origin_paths.
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
WAN_ORIGINAL_PATTERNS = {
    "dit": "diffusion_pytorch_model*.safetensors",
    "text_encoder": "models_t5_umt5-xxl-enc-bf16.pth",
    "vae": "Wan2.1_VAE.pth",
    "tokenizer": "google/umt5-xxl/",
}
WAN_I2V_ORIGINAL_PATTERNS = {**WAN_ORIGINAL_PATTERNS,
                             "image_encoder": "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth"}
WAN22_A14B_PATTERNS = {
    **WAN_ORIGINAL_PATTERNS,
    "dit": "high_noise_model/diffusion_pytorch_model*.safetensors",
    "dit2": "low_noise_model/diffusion_pytorch_model*.safetensors",
}
WAN22_TI2V_PATTERNS = {**WAN_ORIGINAL_PATTERNS, "vae": "Wan2.2_VAE.pth"}

# scheduler/scheduler_config.json of Wan-AI/Wan2.1-T2V-1.3B-Diffusers (UniPC in flow-prediction mode, shift 3).
WAN_SCHEDULER_CONFIG = {
    "_class_name": "UniPCMultistepScheduler", "beta_end": 0.02, "beta_schedule": "linear", "beta_start": 0.0001,
    "disable_corrector": [], "dynamic_thresholding_ratio": 0.995, "final_sigmas_type": "zero", "flow_shift": 3.0,
    "lower_order_final": True, "num_train_timesteps": 1000, "predict_x0": True, "prediction_type": "flow_prediction",
    "rescale_betas_zero_snr": False, "sample_max_value": 1.0, "solver_order": 2, "solver_p": None,
    "solver_type": "bh2", "steps_offset": 0, "thresholding": False, "timestep_spacing": "linspace",
    "trained_betas": None, "use_beta_sigmas": False, "use_exponential_sigmas": False, "use_flow_sigmas": True,
    "use_karras_sigmas": False,
}  # fmt: skip
# The CLIP ViT-H/14 preprocessing of the Wan2.1 I2V repositories, shrunk to the tiny image encoder's image_size.
TINY_CLIP_IMAGE_SIZE = 32
WAN_I2V_IMAGE_PROCESSOR_CONFIG = clip_image_processor_config(TINY_CLIP_IMAGE_SIZE)
TEXT_DIM = 32
_WAN_COMPONENTS = {
    "scheduler": ("diffusers", "UniPCMultistepScheduler"),
    "text_encoder": ("transformers", "UMT5EncoderModel"),
    "tokenizer": ("transformers", "T5TokenizerFast"),
    "transformer": ("diffusers", "WanTransformer3DModel"),
    "vae": ("diffusers", "AutoencoderKLWan"),
}
# Seeds of the components, as offsets from the builder's seed.
_TEXT, _DIT, _VAE, _CLIP, _HIGH_T2V, _LOW_T2V, _HIGH_I2V, _LOW_I2V, _TI2V, _VAE22 = range(10)


def build_t5_tokenizer():
    """A small unigram ``T5Tokenizer``: pad/eos/unk, the word-start piece, letters, digits and a few words."""
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    pieces += [(char, -4.0) for char in "abcdefghijklmnopqrstuvwxyz0123456789.,!?'-"]
    words = ("a", "the", "of", "and", "in", "on", "with", "cat", "dog", "man", "woman", "red", "blue", "photo", "video")
    pieces += [("\u2581" + word, -3.0) for word in words]
    return T5Tokenizer(vocab=pieces, extra_ids=0)


# ---- the tiny models (each built from its own seed) ------------------------------------------------------------------


def tiny_umt5(seed: int, tokenizer) -> torch.nn.Module:
    """UMT5 encoder of width ``TEXT_DIM``; positions saturate at 128 like ``umt5-xxl``."""
    from transformers import UMT5Config, UMT5EncoderModel

    with seeded(seed + _TEXT):
        return UMT5EncoderModel(UMT5Config(
            vocab_size=padded(len(tokenizer)), d_model=TEXT_DIM, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
            relative_attention_num_buckets=8, relative_attention_max_distance=128, feed_forward_proj="gated-gelu",
            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=0,
        ))  # fmt: skip


def tiny_wan_vae(seed: int) -> torch.nn.Module:
    """The Wan2.1 VAE's structure (8x spatial, 4x temporal, 16 latent channels) at width 16."""
    from diffusers import AutoencoderKLWan

    with seeded(seed + _VAE):
        return AutoencoderKLWan(base_dim=16, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                                temperal_downsample=[False, True, True])


def tiny_wan22_vae(seed: int) -> torch.nn.Module:
    """The Wan2.2 VAE's structure (2x2 patches, residual stages, 16x spatial, 48 latent channels) at width 16."""
    from diffusers import AutoencoderKLWan

    with seeded(seed + _VAE22):
        return AutoencoderKLWan(
            base_dim=16, decoder_base_dim=32, z_dim=48, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
            temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12, patch_size=2,
            scale_factor_spatial=16, latents_mean=list(WAN22_LATENTS_MEAN), latents_std=list(WAN22_LATENTS_STD),
        )  # fmt: skip


def tiny_wan_transformer(seed: int, offset: int = _DIT, in_channels: int = 16, out_channels: int = 16,
                         image_dim: int | None = None, pos_embed_seq_len: int | None = None) -> torch.nn.Module:
    """A two-block ``WanTransformer3DModel``; ``image_dim`` makes it a Wan2.1 image-to-video one (image
    cross-attention of the transformer's width, as in the released I2V configs), ``pos_embed_seq_len`` adds the
    FLF2V image positions."""
    from diffusers import WanTransformer3DModel

    with seeded(seed + offset):
        return WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=in_channels,
            out_channels=out_channels, text_dim=TEXT_DIM, freq_dim=32, ffn_dim=64, num_layers=2, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", image_dim=image_dim, added_kv_proj_dim=None if image_dim is None else 32,
            pos_embed_seq_len=pos_embed_seq_len,
        )  # fmt: skip


def tiny_clip_vision(seed: int) -> torch.nn.Module:
    """A ViT-H/14-shaped CLIP vision tower (16 heads, exact GELU) of width 32 on ``TINY_CLIP_IMAGE_SIZE`` images."""
    from transformers import CLIPVisionConfig, CLIPVisionModel

    with seeded(seed + _CLIP):
        return CLIPVisionModel(CLIPVisionConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=16,
            image_size=TINY_CLIP_IMAGE_SIZE, patch_size=8, projection_dim=32, hidden_act="gelu", layer_norm_eps=1e-5,
        ))  # fmt: skip


# ---- the diffusers layout -------------------------------------------------------------------------------------------


def _write_diffusers_shared(repo: Path, seed: int) -> None:
    tokenizer = build_t5_tokenizer()
    tokenizer.save_pretrained(repo / "tokenizer")
    tiny_umt5(seed, tokenizer).save_pretrained(repo / "text_encoder", max_shard_size="50KB")
    tiny_wan_vae(seed).save_pretrained(repo / "vae")
    write_json(repo / "scheduler" / "scheduler_config.json", WAN_SCHEDULER_CONFIG)


def build_tiny_wan(root: Path, model_id: str = WAN_MODEL_ID, seed: int = 0) -> Path:
    """Writes a tiny Wan2.1 text-to-video repo in the diffusers layout at ``root/<model_id>``.

    Layout: ``transformer/`` (WanTransformer3DModel, sharded), ``vae/`` (AutoencoderKLWan, one file),
    ``text_encoder/`` (UMT5EncoderModel, sharded; ``shared.weight`` and ``encoder.embed_tokens.weight`` are tied, so
    only the first is stored), ``tokenizer/``, ``scheduler/`` and ``model_index.json``. Weights are float32.
    """
    repo = prepare_repo(root, model_id)
    _write_diffusers_shared(repo, seed)
    tiny_wan_transformer(seed).save_pretrained(repo / "transformer", max_shard_size=SHARD_SIZE)
    write_json(repo / "model_index.json", model_index("WanPipeline", _WAN_COMPONENTS))
    return repo


def build_tiny_wan_i2v(root: Path, model_id: str = WAN_I2V_MODEL_ID, seed: int = 0) -> Path:
    """Writes a tiny Wan2.1 image-to-video repo in the diffusers layout at ``root/<model_id>``.

    The text-to-video layout plus ``image_encoder/`` (CLIPVisionModel) and ``image_processor/``, with a transformer
    that takes the image: ``in_channels=36`` (16 noisy latents + 4 mask + 16 condition latents) and CLIP features.
    """
    repo = prepare_repo(root, model_id)
    _write_diffusers_shared(repo, seed)
    tiny_clip_vision(seed).save_pretrained(repo / "image_encoder")
    write_json(repo / "image_processor" / "preprocessor_config.json", WAN_I2V_IMAGE_PROCESSOR_CONFIG)
    tiny_wan_transformer(seed, in_channels=36, image_dim=32).save_pretrained(repo / "transformer",
                                                                             max_shard_size=SHARD_SIZE)
    components = {**_WAN_COMPONENTS, "image_encoder": ("transformers", "CLIPVisionModel"),
                  "image_processor": ("transformers", "CLIPImageProcessor")}  # fmt: skip
    write_json(repo / "model_index.json", model_index("WanImageToVideoPipeline", components))
    return repo


# ---- the original layouts --------------------------------------------------------------------------------------------


def _save_pth(state_dict: dict[str, torch.Tensor], path: Path) -> None:
    torch.save({key: tensor.detach().clone().contiguous() for key, tensor in state_dict.items()}, str(path))


def write_original_dit(folder: Path, transformer: torch.nn.Module, model_type: str) -> None:
    """A DiT as the releases ship it: ``config.json`` naming ``WanModel`` and original-named sharded safetensors."""
    state = transformer.state_dict()
    names = dit_original_keys(list(state))
    save_sharded_safetensors({names[key]: tensor for key, tensor in state.items()}, folder, "diffusion_pytorch_model")
    write_json(folder / "config.json", original_dit_config_json(dict(transformer.config), model_type))


def write_original_vae(path: Path, vae: torch.nn.Module) -> None:
    state = vae.state_dict()
    names = vae_original_keys(list(state), dict(vae.config))
    _save_pth({names[key]: tensor for key, tensor in state.items()}, path)


def write_original_clip(path: Path, image_encoder: torch.nn.Module, seed: int) -> None:
    """The whole XLM-RoBERTa CLIP file: the vision tower under its original names, plus stand-ins of the parts no
    Wan pipeline reads (text tower, logit scale, projection head), as the release holds them."""
    state = clip_original_state_dict(image_encoder.state_dict())
    config = image_encoder.config
    with seeded(seed + _CLIP):
        state.update({"log_scale": torch.tensor(4.6), "visual.head": torch.randn(config.hidden_size,
                      config.projection_dim), "textual.token_embedding.weight": torch.randn(16, 24)})  # fmt: skip
    _save_pth(state, path)


def _write_original_shared(repo: Path, seed: int, vae: torch.nn.Module, vae_name: str) -> None:
    tokenizer = build_t5_tokenizer()
    tokenizer.save_pretrained(repo / "google" / "umt5-xxl")
    _save_pth(umt5_original_state_dict(tiny_umt5(seed, tokenizer).state_dict()),
              repo / "models_t5_umt5-xxl-enc-bf16.pth")
    write_original_vae(repo / vae_name, vae)


def build_tiny_wan_original(root: Path, model_id: str = WAN_ORIGINAL_MODEL_ID, seed: int = 0) -> Path:
    """Writes the original layout of ``Wan-AI/Wan2.1-T2V-1.3B``; the weights are ``build_tiny_wan``'s."""
    repo = prepare_repo(root, model_id)
    _write_original_shared(repo, seed, tiny_wan_vae(seed), "Wan2.1_VAE.pth")
    write_original_dit(repo, tiny_wan_transformer(seed), "t2v")
    return repo


def build_tiny_wan_i2v_original(root: Path, model_id: str = WAN_I2V_ORIGINAL_MODEL_ID, seed: int = 0) -> Path:
    """Writes the original layout of ``Wan-AI/Wan2.1-I2V-14B-480P``; the weights are ``build_tiny_wan_i2v``'s."""
    repo = prepare_repo(root, model_id)
    _write_original_shared(repo, seed, tiny_wan_vae(seed), "Wan2.1_VAE.pth")
    write_original_clip(repo / WAN_I2V_ORIGINAL_PATTERNS["image_encoder"], tiny_clip_vision(seed), seed)
    write_original_dit(repo, tiny_wan_transformer(seed, in_channels=36, image_dim=32), "i2v")
    return repo


def build_tiny_wan22_t2v(root: Path, model_id: str = WAN22_T2V_MODEL_ID, seed: int = 0) -> Path:
    """Writes the layout of ``Wan-AI/Wan2.2-T2V-A14B``: two experts in ``high_noise_model/`` and ``low_noise_model/``
    beside the shared T5 encoder, tokenizer and Wan2.1 VAE."""
    repo = prepare_repo(root, model_id)
    _write_original_shared(repo, seed, tiny_wan_vae(seed), "Wan2.1_VAE.pth")
    write_original_dit(repo / "high_noise_model", tiny_wan_transformer(seed, _HIGH_T2V), "t2v")
    write_original_dit(repo / "low_noise_model", tiny_wan_transformer(seed, _LOW_T2V), "t2v")
    return repo


def build_tiny_wan22_i2v(root: Path, model_id: str = WAN22_I2V_MODEL_ID, seed: int = 0) -> Path:
    """Writes the layout of ``Wan-AI/Wan2.2-I2V-A14B``: image-conditioned experts (36 input channels, no CLIP)."""
    repo = prepare_repo(root, model_id)
    _write_original_shared(repo, seed, tiny_wan_vae(seed), "Wan2.1_VAE.pth")
    write_original_dit(repo / "high_noise_model", tiny_wan_transformer(seed, _HIGH_I2V, in_channels=36), "i2v")
    write_original_dit(repo / "low_noise_model", tiny_wan_transformer(seed, _LOW_I2V, in_channels=36), "i2v")
    return repo


def build_tiny_wan22_ti2v(root: Path, model_id: str = WAN22_TI2V_MODEL_ID, seed: int = 0) -> Path:
    """Writes the layout of ``Wan-AI/Wan2.2-TI2V-5B``: a 48-channel DiT and the 16x-compressing Wan2.2 VAE."""
    repo = prepare_repo(root, model_id)
    _write_original_shared(repo, seed, tiny_wan22_vae(seed), "Wan2.2_VAE.pth")
    write_original_dit(repo, tiny_wan_transformer(seed, _TI2V, in_channels=48, out_channels=48), "ti2v")
    return repo


WAN_BUILDERS = {
    "wan": build_tiny_wan, "wan_i2v": build_tiny_wan_i2v, "wan_original": build_tiny_wan_original,
    "wan_i2v_original": build_tiny_wan_i2v_original, "wan22_t2v": build_tiny_wan22_t2v,
    "wan22_i2v": build_tiny_wan22_i2v, "wan22_ti2v": build_tiny_wan22_ti2v,
}  # fmt: skip
