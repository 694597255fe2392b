"""Tiny random-weight Stable Diffusion 1.5 and SDXL base repos (``AI-ModelScope/stable-diffusion-v1-5``,
``stabilityai/stable-diffusion-xl-base-1.0``) in the released diffusers layout.

Folders as released: ``unet/diffusion_pytorch_model.safetensors`` (``UNet2DConditionModel``), ``vae/`` (``AutoencoderKL``,
4 latent channels, SD's ``scaling_factor`` 0.18215), ``text_encoder/model.safetensors`` (``CLIPTextModel``, its tensors
named ``text_model.*`` as in the release), ``tokenizer/`` (CLIP's byte-level BPE, in small), ``scheduler/`` and a root
``model_index.json``. The scheduler config holds the release's schedule values under ``DDIMScheduler`` (the release
names ``PNDMScheduler``, whose values are the same): diffusers' own pipeline then samples as this project does, with
DDIM.

Tiny sizes: a UNet of two levels (32 and 64 channels, one layer each, cross-attention 32 wide); the VAE has four
levels, so that it compresses 8x as the released one does.
"""

from __future__ import annotations

from pathlib import Path

from ..pipelines.stable_diffusion.pipeline import SD15_SCHEDULER_CONFIG
from .tiny_common import model_index, prepare_repo, seeded, write_json
from .tiny_flux import write_clip

SD15_MODEL_ID = "AI-ModelScope/stable-diffusion-v1-5"

# Patterns that select each component, as the reference's commands give them to --model_id_with_origin_paths.
SD15_PATTERNS = {
    "unet": "unet/diffusion_pytorch_model.safetensors",
    "text_encoder": "text_encoder/model.safetensors",
    "vae": "vae/diffusion_pytorch_model.safetensors",
    "tokenizer": "tokenizer/",
}

CROSS_ATTENTION_DIM = 32
UNET_CONFIG = {
    "sample_size": 4, "in_channels": 4, "out_channels": 4, "layers_per_block": 1, "block_out_channels": (32, 64),
    "down_block_types": ("CrossAttnDownBlock2D", "DownBlock2D"), "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D"),
    "cross_attention_dim": CROSS_ATTENTION_DIM, "attention_head_dim": 8, "norm_num_groups": 32,
}  # fmt: skip
VAE_CONFIG = {
    "in_channels": 3, "out_channels": 3, "latent_channels": 4, "block_out_channels": (32, 32, 64, 64),
    "layers_per_block": 1,
    "down_block_types": ("DownEncoderBlock2D",) * 4, "up_block_types": ("UpDecoderBlock2D",) * 4,
    "norm_num_groups": 32, "scaling_factor": 0.18215,
}  # fmt: skip
_COMPONENTS = {
    "unet": ("diffusers", "UNet2DConditionModel"), "vae": ("diffusers", "AutoencoderKL"),
    "text_encoder": ("transformers", "CLIPTextModel"), "tokenizer": ("transformers", "CLIPTokenizer"),
    "scheduler": ("diffusers", "DDIMScheduler"), "safety_checker": (None, None), "feature_extractor": (None, None),
}  # fmt: skip
_UNET, _CLIP, _VAE, _CLIP_2 = range(4)  # seed offsets

SDXL_MODEL_ID = "stabilityai/stable-diffusion-xl-base-1.0"
SDXL_PATTERNS = {**SD15_PATTERNS, "text_encoder_2": "text_encoder_2/model.safetensors", "tokenizer_2": "tokenizer_2/"}
SDXL_TEXT_WIDTH = 32  # each CLIP's; the UNet's context is both side by side
# SDXL base's UNet layout (its block types, two layers per block, 1 / 2 / 10 transformer layers, linear projections,
# the text_time embedding), narrow: the reference's LoRA script names its layers one by one.
SDXL_UNET_CONFIG = {
    "sample_size": 4, "in_channels": 4, "out_channels": 4, "layers_per_block": 2, "block_out_channels": (32, 32, 64),
    "down_block_types": ("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    "up_block_types": ("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    "transformer_layers_per_block": (1, 2, 10), "attention_head_dim": (2, 2, 4), "use_linear_projection": True,
    "cross_attention_dim": 2 * SDXL_TEXT_WIDTH, "addition_embed_type": "text_time", "addition_time_embed_dim": 8,
    "projection_class_embeddings_input_dim": 6 * 8 + SDXL_TEXT_WIDTH, "norm_num_groups": 8,
}  # fmt: skip


def build_tiny_stable_diffusion(root: Path, model_id: str = SD15_MODEL_ID, seed: int = 0,
                                prediction_type: str = "epsilon") -> Path:
    """Writes a tiny SD 1.5 repo at ``root/<model_id>`` and returns its folder (float32 weights).

    Args:
        root: The model base folder (a ``DIFFSYNTH_MODEL_BASE_PATH``).
        model_id: The repository id to write it under.
        seed: Seed of the random weights.
        prediction_type: The scheduler config's ``prediction_type`` (``v_prediction`` for an SD 2.x-like repo).
    """
    from diffusers import AutoencoderKL, UNet2DConditionModel

    repo = prepare_repo(root, model_id)
    with seeded(seed + _UNET):
        UNet2DConditionModel(**UNET_CONFIG).save_pretrained(repo / "unet")
    write_clip(repo, CROSS_ATTENTION_DIM, seed + _CLIP)
    with seeded(seed + _VAE):
        AutoencoderKL(**VAE_CONFIG).save_pretrained(repo / "vae")
    # The released schedule values (its PNDMScheduler config) under the class diffusers' pipeline samples with here.
    write_json(repo / "scheduler" / "scheduler_config.json", {**SD15_SCHEDULER_CONFIG, "_class_name": "DDIMScheduler",
                                                              "prediction_type": prediction_type})
    write_json(repo / "model_index.json", model_index("StableDiffusionPipeline", _COMPONENTS,
                                                      requires_safety_checker=False))
    return repo


def build_tiny_sdxl(root: Path, model_id: str = SDXL_MODEL_ID, seed: int = 0) -> Path:
    """Writes a tiny SDXL base repo at ``root/<model_id>`` (``text_encoder_2/`` and ``tokenizer_2/`` beside SD's
    folders; the UNet with SDXL's block layout and time-id embedding) and returns its folder (float32 weights)."""
    from diffusers import AutoencoderKL, UNet2DConditionModel

    repo = prepare_repo(root, model_id)
    with seeded(seed + _UNET):
        UNet2DConditionModel(**SDXL_UNET_CONFIG).save_pretrained(repo / "unet")
    write_clip(repo, SDXL_TEXT_WIDTH, seed + _CLIP)
    write_clip(repo, SDXL_TEXT_WIDTH, seed + _CLIP_2, suffix="_2", with_projection=True)
    with seeded(seed + _VAE):
        AutoencoderKL(**{**VAE_CONFIG, "scaling_factor": 0.13025, "force_upcast": True}).save_pretrained(repo / "vae")
    write_json(repo / "scheduler" / "scheduler_config.json", {**SD15_SCHEDULER_CONFIG, "_class_name": "DDIMScheduler"})
    write_json(repo / "model_index.json", model_index("StableDiffusionXLPipeline", {
        **{name: value for name, value in _COMPONENTS.items() if name in ("unet", "vae", "text_encoder", "tokenizer",
                                                                          "scheduler")},
        "text_encoder_2": ("transformers", "CLIPTextModelWithProjection"),
        "tokenizer_2": ("transformers", "CLIPTokenizer"),
    }, force_zeros_for_empty_prompt=True))
    return repo


STABLE_DIFFUSION_BUILDERS = {"stable_diffusion_v1_5": build_tiny_stable_diffusion, "sdxl_base": build_tiny_sdxl}
