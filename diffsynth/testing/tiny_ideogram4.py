"""A tiny random-weight Ideogram 4 repo in diffusers' layout (``ideogram-ai/ideogram-v4``, the id of diffusers'
example), which both diffusers' ``Ideogram4Pipeline`` and ours read.

It holds ``transformer/`` and ``unconditional_transformer/`` (two ``Ideogram4Transformer2DModel`` of different seeds),
``text_encoder/`` (a ``Qwen3VLModel`` with the 36 decoder layers the 13 activation taps need, 16 wide),
``tokenizer/`` (the byte-level Qwen tokenizer of the other tiny repos with a Qwen chat template), ``vae/``
(``AutoencoderKLFlux2`` with random batch-norm statistics), ``scheduler/`` and ``model_index.json``.
"""

from __future__ import annotations

from pathlib import Path

from .tiny_common import SHARD_SIZE, model_index, padded, prepare_repo, seeded, write_json
from .tiny_ernie_image import tiny_flux2_vae

IDEOGRAM4_MODEL_ID = "ideogram-ai/ideogram-v4"
IDEOGRAM4_PATTERNS = {
    "dit": "transformer/diffusion_pytorch_model*.safetensors",
    "dit_uncond": "unconditional_transformer/diffusion_pytorch_model*.safetensors",
    "text_encoder": "text_encoder/model*.safetensors",
    "vae": "vae/diffusion_pytorch_model.safetensors",
    "tokenizer": "tokenizer/",
}
TEXT_HIDDEN_SIZE = 16
TEXT_LAYERS = 36
TAPS = 13
TRANSFORMER_CONFIG = {
    "in_channels": 128, "num_layers": 2, "attention_head_dim": 16, "num_attention_heads": 2,
    "intermediate_size": 64, "adaln_dim": 16, "llm_features_dim": TAPS * TEXT_HIDDEN_SIZE, "mrope_section": (4, 2, 2),
}  # fmt: skip
CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% for part in message['content'] %}"
                 "{{ part['text'] }}{% endfor %}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SCHEDULER_CONFIG = {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 1.0,
                    "use_dynamic_shifting": False}
_COMPONENTS = {
    "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
    "text_encoder": ("transformers", "Qwen3VLModel"),
    "tokenizer": ("transformers", "Qwen2Tokenizer"),
    "transformer": ("diffusers", "Ideogram4Transformer2DModel"),
    "unconditional_transformer": ("diffusers", "Ideogram4Transformer2DModel"),
    "vae": ("diffusers", "AutoencoderKLFlux2"),
}


def _transformer(seed: int):
    from diffusers import Ideogram4Transformer2DModel

    with seeded(seed):
        transformer = Ideogram4Transformer2DModel(**TRANSFORMER_CONFIG)
        # diffusers zero-initialises nothing here, but norms start at one; random values make them count.
        for name, parameter in transformer.named_parameters():
            if "norm" in name:
                parameter.data.normal_(1.0, 0.1)
    return transformer


def build_tiny_ideogram4(root: Path, seed: int = 0) -> Path:
    """Writes the tiny repo at ``root/ideogram-ai/ideogram-v4``; float32 weights. Returns the repo."""
    from transformers import Qwen3VLConfig, Qwen3VLModel

    from .tiny_models import build_qwen_tokenizer  # imported here: tiny_models imports the builders

    repo = prepare_repo(root, IDEOGRAM4_MODEL_ID)
    tokenizer = build_qwen_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(repo / "tokenizer")
    token = tokenizer.convert_tokens_to_ids
    text_config = {
        "hidden_size": TEXT_HIDDEN_SIZE, "intermediate_size": 32, "num_hidden_layers": TEXT_LAYERS,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "vocab_size": padded(len(tokenizer)),
        "rope_parameters": {"rope_type": "default", "rope_theta": 5e6, "mrope_section": [2, 1, 1],
                            "mrope_interleaved": True},
    }  # fmt: skip
    vision_config = {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
                     "out_hidden_size": TEXT_HIDDEN_SIZE, "deepstack_visual_indexes": [0],
                     "num_position_embeddings": 16}
    with seeded(seed + 5):
        encoder = Qwen3VLModel(Qwen3VLConfig(
            text_config=text_config, vision_config=vision_config, image_token_id=token("<|image_pad|>"),
            video_token_id=token("<|video_pad|>"), vision_start_token_id=token("<|vision_start|>"),
            vision_end_token_id=token("<|vision_end|>")))
    encoder.save_pretrained(repo / "text_encoder", max_shard_size="1GB")
    tiny_flux2_vae(seed + 6).save_pretrained(repo / "vae")
    _transformer(seed + 7).save_pretrained(repo / "transformer", max_shard_size=SHARD_SIZE)
    _transformer(seed + 8).save_pretrained(repo / "unconditional_transformer", max_shard_size=SHARD_SIZE)
    write_json(repo / "scheduler" / "scheduler_config.json", SCHEDULER_CONFIG)
    write_json(repo / "model_index.json", model_index("Ideogram4Pipeline", _COMPONENTS))
    return repo


IDEOGRAM4_BUILDERS = {"ideogram4": build_tiny_ideogram4}
