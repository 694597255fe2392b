"""A tiny random-weight Ideogram 4 repo in diffusers' layout (``ideogram-ai/ideogram-v4``, the id of diffusers'
example), which both diffusers' ``Ideogram4Pipeline`` and ours read.

It holds ``transformer/`` and ``unconditional_transformer/`` (two ``Ideogram4Transformer2DModel`` of different seeds),
``text_encoder/`` (a ``Qwen3VLModel`` with the 36 decoder layers the 13 activation taps need, 16 wide),
``tokenizer/`` (the byte-level Qwen tokenizer of the other tiny repos with a Qwen chat template), ``vae/``
(``AutoencoderKLFlux2`` with random batch-norm statistics), ``scheduler/`` and ``model_index.json``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

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
BF16_REPACKAGE_ID = "DiffSynth-Studio/ideogram-4-bf16-repackage"
FP8_ID = "ideogram-ai/ideogram-4-fp8"
NF4_ID = "ideogram-ai/ideogram-4-nf4"
# The Ideogram-layout releases: one head of the released 256 dims (their files do not record the rotary split).
RELEASE_TRANSFORMER_CONFIG = {**TRANSFORMER_CONFIG, "attention_head_dim": 256, "num_attention_heads": 1,
                              "mrope_section": (24, 20, 20)}
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


def _transformer(seed: int, config: dict = TRANSFORMER_CONFIG):
    from diffusers import Ideogram4Transformer2DModel

    with seeded(seed):
        transformer = Ideogram4Transformer2DModel(**config)
        # diffusers zero-initialises nothing here, but norms start at one; random values make them count.
        for name, parameter in transformer.named_parameters():
            if "norm" in name:
                parameter.data.normal_(1.0, 0.1)
    return transformer


def _write_shared_parts(repo: Path, seed: int, quantize=None) -> None:
    """Writes ``tokenizer/``, ``text_encoder/`` (its state dict through ``quantize`` when given) and ``vae/``."""
    from safetensors.torch import save_file
    from transformers import Qwen3VLConfig, Qwen3VLModel

    from .tiny_models import build_qwen_tokenizer  # imported here: tiny_models imports the builders

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
    if quantize is not None:
        save_file(quantize(encoder.state_dict()), str(repo / "text_encoder" / "model.safetensors"))
    tiny_flux2_vae(seed + 6).save_pretrained(repo / "vae")


def build_tiny_ideogram4(root: Path, seed: int = 0) -> Path:
    """Writes the tiny repo at ``root/ideogram-ai/ideogram-v4``; float32 weights. Returns the repo."""
    repo = prepare_repo(root, IDEOGRAM4_MODEL_ID)
    _write_shared_parts(repo, seed)
    _transformer(seed + 7).save_pretrained(repo / "transformer", max_shard_size=SHARD_SIZE)
    _transformer(seed + 8).save_pretrained(repo / "unconditional_transformer", max_shard_size=SHARD_SIZE)
    write_json(repo / "scheduler" / "scheduler_config.json", SCHEDULER_CONFIG)
    write_json(repo / "model_index.json", model_index("Ideogram4Pipeline", _COMPONENTS))
    return repo


def quantize_nf4(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state_dict`` as the NF4 release stores it: the weight of every Linear (every 2-D ``.weight`` but an
    embedding table's) replaced by exactly what bitsandbytes' ``Linear4bit.state_dict()`` writes for it, NF4 in
    blocks of 64 without double quantization (the release's ``compress_statistics=False``); the rest unchanged."""
    import bitsandbytes as bnb

    out = {}
    for key, value in state_dict.items():
        module = key.removesuffix(".weight").rpartition(".")[2]
        if not (key.endswith(".weight") and value.dim() == 2 and "embed" not in module):
            out[key] = value
            continue
        layer = bnb.nn.Linear4bit(value.shape[1], value.shape[0], bias=False, compress_statistics=False,
                                  quant_type="nf4", device="meta")
        layer.weight = bnb.nn.Params4bit(value.contiguous(), requires_grad=False, compress_statistics=False,
                                         quant_type="nf4").to("cpu")  # packed when moved to a device
        out.update({f"{key.removesuffix('weight')}{name}": tensor for name, tensor in layer.state_dict().items()})
    return out


def build_tiny_ideogram4_release(root: Path, model_id: str, seed: int = 0, quantize: str | None = None) -> Path:
    """Writes the tiny repo ``root/model_id`` in Ideogram's layout (float32, or ``quantize`` ``"fp8"`` with scales or
    ``"nf4"`` packed) and a float32 VAE. Returns the repo."""
    from safetensors.torch import save_file

    from ..pipelines.ideogram4.original import quantize_fp8, transformer_to_original

    repo = prepare_repo(root, model_id)
    quantizer = {None: None, "fp8": quantize_fp8, "nf4": quantize_nf4}[quantize]
    _write_shared_parts(repo, seed, quantizer)
    state_dict = transformer_to_original(_transformer(seed + 7, RELEASE_TRANSFORMER_CONFIG).state_dict())
    (repo / "transformer").mkdir()
    save_file(quantizer(state_dict) if quantizer else state_dict,
              str(repo / "transformer" / "diffusion_pytorch_model.safetensors"))
    return repo


IDEOGRAM4_BUILDERS = {
    "ideogram4": build_tiny_ideogram4,
    "ideogram4_bf16_repackage": lambda root, seed=0: build_tiny_ideogram4_release(root, BF16_REPACKAGE_ID, seed),
    "ideogram4_fp8": lambda root, seed=0: build_tiny_ideogram4_release(root, FP8_ID, seed, quantize="fp8"),
}
if importlib.util.find_spec("bitsandbytes") is not None:  # optional (the quant extra): its tests skip without it
    IDEOGRAM4_BUILDERS["ideogram4_nf4"] = lambda root, seed=0: build_tiny_ideogram4_release(root, NF4_ID, seed, "nf4")
