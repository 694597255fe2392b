"""Tiny random-weight Krea 2 repos (``krea/Krea-2-Raw``, ``krea/Krea-2-Turbo``) and the ``Qwen/Qwen3-VL-4B-Instruct``
text encoder they read, in the layouts the reference's commands load.

- ``krea/Krea-2-Raw/raw.safetensors`` and ``krea/Krea-2-Turbo/turbo.safetensors``: the transformer in Krea's own
  layout (``first``, ``blocks.N.attn.wq``, ``txtfusion``, ``last``; ``pipelines/krea2/original.py``), written from a
  ``Krea2Transformer2DModel`` through ``transformer_to_original``.
- ``Qwen/Qwen3-VL-4B-Instruct/``: a transformers repo at its root (``config.json`` naming
  ``Qwen3VLForConditionalGeneration``, ``model-0000i-of-0000n.safetensors`` with an index, the tokenizer files).
- The VAE is Qwen-Image's (``Qwen/Qwen-Image:vae/``), built by the Qwen-Image builder.

Beside the single file, each Krea repo also holds the diffusers layout ``Krea2Pipeline.from_pretrained`` reads (the
same transformer in ``transformer/``, the text encoder's ``Qwen3VLModel`` in ``text_encoder/``, ``tokenizer/``,
Qwen-Image's ``vae/``, ``scheduler/`` and ``model_index.json`` with ``is_distilled`` and the encoder's taps), so the
tests compare against diffusers' own pipeline on the same weights.

The text encoder has 5 layers and the transformer reads 2 taps of it: every third hidden state counted back from the
second-to-last, as the release's 12 taps (2, 5, ..., 35) of Qwen3-VL-4B's 36 layers are (``pipelines/krea2``).
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

from .tiny_common import SHARD_SIZE, model_index, padded, prepare_repo, seeded, write_json

KREA2_RAW_MODEL_ID = "krea/Krea-2-Raw"
KREA2_TURBO_MODEL_ID = "krea/Krea-2-Turbo"
QWEN3_VL_MODEL_ID = "Qwen/Qwen3-VL-4B-Instruct"
QWEN_IMAGE_MODEL_ID = "Qwen/Qwen-Image"

# The reference's --model_id_with_origin_paths entries, by pipeline slot, as "model_id:pattern".
KREA2_MODELS = {
    KREA2_RAW_MODEL_ID: {"dit": f"{KREA2_RAW_MODEL_ID}:raw.safetensors",
                         "text_encoder": f"{QWEN3_VL_MODEL_ID}:*.safetensors",
                         "vae": f"{QWEN_IMAGE_MODEL_ID}:vae/diffusion_pytorch_model.safetensors"},
    KREA2_TURBO_MODEL_ID: {"dit": f"{KREA2_TURBO_MODEL_ID}:turbo.safetensors",
                           "text_encoder": f"{QWEN3_VL_MODEL_ID}:*.safetensors",
                           "vae": f"{QWEN_IMAGE_MODEL_ID}:vae/diffusion_pytorch_model.safetensors"},
}
KREA2_TOKENIZER = f"{QWEN3_VL_MODEL_ID}:"

TEXT_HIDDEN_SIZE = 32
TEXT_LAYERS = 5
TRANSFORMER_CONFIG = {
    "in_channels": 64, "num_layers": 2, "attention_head_dim": 16, "num_attention_heads": 2, "num_key_value_heads": 1,
    "intermediate_size": 64, "timestep_embed_dim": 32, "text_hidden_dim": TEXT_HIDDEN_SIZE, "num_text_layers": 2,
    "text_num_attention_heads": 2, "text_num_key_value_heads": 2, "text_intermediate_size": 64,
    "num_layerwise_text_blocks": 1, "num_refiner_text_blocks": 1, "axes_dims_rope": (4, 6, 6),
}  # fmt: skip
# The transformer's seed offset per release (the text encoder takes ``seed + 5``).
TRANSFORMER_SEEDS = {KREA2_RAW_MODEL_ID: 6, KREA2_TURBO_MODEL_ID: 7}
SINGLE_FILES = {KREA2_RAW_MODEL_ID: "raw.safetensors", KREA2_TURBO_MODEL_ID: "turbo.safetensors"}
# diffusers' Krea 2 schedule: resolution-aware exponential shift (Turbo fixes mu at 1.15 through is_distilled).
SCHEDULER_CONFIG = {
    "_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "use_dynamic_shifting": True,
    "base_shift": 0.5, "max_shift": 1.15, "base_image_seq_len": 256, "max_image_seq_len": 6400, "shift": 1.0,
}  # fmt: skip
_COMPONENTS = {
    "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
    "text_encoder": ("transformers", "Qwen3VLModel"),
    "tokenizer": ("transformers", "Qwen2Tokenizer"),
    "transformer": ("diffusers", "Krea2Transformer2DModel"),
    "vae": ("diffusers", "AutoencoderKLQwenImage"),
}


def _tokenizer():
    from .tiny_models import build_qwen_tokenizer  # imported here: tiny_models imports this module for BUILDERS

    tokenizer = build_qwen_tokenizer()
    tokenizer.pad_token = "<|endoftext|>"
    return tokenizer


def build_tiny_qwen3_vl(root: Path, seed: int = 0) -> Path:
    """Writes ``Qwen/Qwen3-VL-4B-Instruct`` (a ``Qwen3VLForConditionalGeneration``, seed ``seed + 5``, and its
    tokenizer, all at the repo's root) unless it is there already; returns the repo."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    repo = Path(root) / QWEN3_VL_MODEL_ID
    if (repo / "config.json").is_file():
        return repo
    repo = prepare_repo(root, QWEN3_VL_MODEL_ID)
    tokenizer = _tokenizer()
    tokenizer.save_pretrained(repo)
    token = tokenizer.convert_tokens_to_ids
    text_config = {
        "hidden_size": TEXT_HIDDEN_SIZE, "intermediate_size": 64, "num_hidden_layers": TEXT_LAYERS,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "vocab_size": padded(len(tokenizer)),
        "bos_token_id": token("<|endoftext|>"), "eos_token_id": token("<|im_end|>"),
        "rope_parameters": {"rope_type": "default", "rope_theta": 5e6, "mrope_section": [2, 3, 3],
                            "mrope_interleaved": True},
    }  # fmt: skip
    vision_config = {
        "depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": TEXT_HIDDEN_SIZE,
        "deepstack_visual_indexes": [0], "num_position_embeddings": 16,
    }  # fmt: skip
    with seeded(seed + 5):
        model = Qwen3VLForConditionalGeneration(Qwen3VLConfig(
            text_config=text_config, vision_config=vision_config, image_token_id=token("<|image_pad|>"),
            video_token_id=token("<|video_pad|>"), vision_start_token_id=token("<|vision_start|>"),
            vision_end_token_id=token("<|vision_end|>"), tie_word_embeddings=True))
    model.save_pretrained(repo, max_shard_size=SHARD_SIZE)
    return repo


def _qwen_image_vae(root: Path, seed: int) -> Path:
    """Qwen-Image's ``vae/`` folder, building the tiny Qwen-Image repo first when it is not under ``root``."""
    folder = Path(root) / QWEN_IMAGE_MODEL_ID / "vae"
    if not (folder / "config.json").is_file():
        from .tiny_models import build_tiny_qwen_image

        build_tiny_qwen_image(Path(root), seed=seed)
    return folder


def build_tiny_krea2(root: Path, model_id: str = KREA2_RAW_MODEL_ID, seed: int = 0) -> Path:
    """Writes a tiny Krea 2 repo (``krea/Krea-2-Raw`` or ``krea/Krea-2-Turbo``) at ``root/<model_id>``, and the
    Qwen3-VL and Qwen-Image repos it reads when missing. Weights are float32.

    Raises:
        ValueError: ``model_id`` is not one of the two releases.
    """
    from diffusers import Krea2Transformer2DModel
    from safetensors.torch import save_file
    from transformers import Qwen3VLForConditionalGeneration

    from ..pipelines.krea2.original import transformer_to_original
    from ..pipelines.krea2.pipeline import text_encoder_taps

    if model_id not in TRANSFORMER_SEEDS:
        raise ValueError(f"model_id={model_id!r} is not a Krea 2 release; choose from {sorted(TRANSFORMER_SEEDS)}")
    encoder_repo = build_tiny_qwen3_vl(root, seed)
    vae = _qwen_image_vae(root, seed)
    repo = prepare_repo(root, model_id)
    with seeded(seed + TRANSFORMER_SEEDS[model_id]):
        transformer = Krea2Transformer2DModel(**TRANSFORMER_CONFIG)
        # diffusers initialises the modulation tables and norms at zero; random values make them count in the tests.
        for name, parameter in transformer.named_parameters():
            if "scale_shift_table" in name or "norm" in name:
                parameter.data.normal_(0.0, 0.1)
    save_file(transformer_to_original(transformer.state_dict()), str(repo / SINGLE_FILES[model_id]))
    transformer.save_pretrained(repo / "transformer", max_shard_size=SHARD_SIZE)
    encoder = Qwen3VLForConditionalGeneration.from_pretrained(str(encoder_repo))
    encoder.model.save_pretrained(repo / "text_encoder", max_shard_size=SHARD_SIZE)
    _tokenizer().save_pretrained(repo / "tokenizer")
    shutil.copytree(vae, repo / "vae")
    write_json(repo / "scheduler" / "scheduler_config.json", SCHEDULER_CONFIG)
    write_json(repo / "model_index.json", model_index(
        "Krea2Pipeline", _COMPONENTS, is_distilled=model_id == KREA2_TURBO_MODEL_ID, patch_size=2,
        text_encoder_select_layers=list(text_encoder_taps(TEXT_LAYERS))))
    return repo


KREA2_BUILDERS = {
    "krea2_raw": functools.partial(build_tiny_krea2, model_id=KREA2_RAW_MODEL_ID),
    "krea2_turbo": functools.partial(build_tiny_krea2, model_id=KREA2_TURBO_MODEL_ID),
}
