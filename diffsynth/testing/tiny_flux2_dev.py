"""A tiny random-weight FLUX.2 [dev] repo (``black-forest-labs/FLUX.2-dev``), written in the released diffusers layout.

The repo holds ``transformer/`` (``Flux2Transformer2DModel`` with the guidance embedding, sharded), ``text_encoder/``
(``Mistral3ForConditionalGeneration``: a Mistral language model and a one-layer Pixtral vision tower, sharded under the
checkpoint names transformers writes, as the released files hold them), ``tokenizer/`` (a byte-level tokenizer with
Mistral's control tokens, a Mistral-style chat template, and the Pixtral processor's config files), ``vae/``
(``AutoencoderKLFlux2``, one file), ``scheduler/scheduler_config.json`` and ``model_index.json`` naming
``Flux2Pipeline``.

diffusers stacks the text encoder's hidden states 10, 20 and 30, so the tiny encoder has 31 layers; the transformer's
``joint_attention_dim`` is three times its hidden size. The transformer has the release's 48 single-stream blocks,
because the reference's LoRA script names ``single_transformer_blocks.0..47.attn.to_out`` one by one.

diffusers loads ``tokenizer/`` as a ``PixtralProcessor``, which needs torchvision; a test without it passes the folder's
tokenizer (``AutoTokenizer``) to diffusers instead. Both render the chat template and tokenize it alike for a text-only
prompt (the template begins with the BOS token, so neither adds another).
"""

from __future__ import annotations

from pathlib import Path

from .tiny_common import SHARD_SIZE, model_index, padded, prepare_repo, seeded, write_json
from .tiny_flux2 import FLUX2_SCHEDULER_CONFIG, write_flux2_transformer, write_flux2_vae

FLUX2_DEV_MODEL_ID = "black-forest-labs/FLUX.2-dev"
TEXT_HIDDEN = 16
TEXT_ENCODER_LAYERS = 31  # hidden states 10, 20 and 30 are read
DOUBLE_BLOCKS, SINGLE_BLOCKS = 2, 48

MISTRAL_CONTROL_TOKENS = ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]",
                          "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "<pad>")
# Mistral's layout of a conversation: the system prompt, then each user turn in [INST] ... [/INST]; a message's content
# may be a string or a list of typed parts (diffusers passes a list with one text part).
MISTRAL_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['content'] is string %}{% set text = message['content'] %}"
    "{% else %}{% set text = message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') "
    "| join('') %}{% endif %}"
    "{% if message['role'] == 'system' %}[SYSTEM_PROMPT]{{ text }}[/SYSTEM_PROMPT]"
    "{% elif message['role'] == 'user' %}[INST]{{ text }}[/INST]"
    "{% else %}{{ text }}{{ eos_token }}{% endif %}{% endfor %}"
)
# The Pixtral processor's files of the release, for a 32-pixel vision tower with 8-pixel patches.
PIXTRAL_PROCESSOR_CONFIG = {"image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]", "image_token": "[IMG]",
                            "patch_size": 8, "processor_class": "PixtralProcessor", "spatial_merge_size": 2}
PIXTRAL_PREPROCESSOR_CONFIG = {
    "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "PixtralImageProcessor", "patch_size": {"height": 8, "width": 8},
    "processor_class": "PixtralProcessor", "resample": 3, "rescale_factor": 1 / 255, "size": {"longest_edge": 32},
}  # fmt: skip
_COMPONENTS = {
    "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
    "text_encoder": ("transformers", "Mistral3ForConditionalGeneration"),
    "tokenizer": ("transformers", "PixtralProcessor"),
    "transformer": ("diffusers", "Flux2Transformer2DModel"),
    "vae": ("diffusers", "AutoencoderKLFlux2"),
}


def build_mistral_tokenizer():
    """A byte-level BPE tokenizer (one token per byte) after Mistral's control tokens, adding ``<s>`` in front of
    plain text as Mistral's does, with ``MISTRAL_CHAT_TEMPLATE``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {token: index for index, token in enumerate(MISTRAL_CONTROL_TOKENS)}
    for character in bytes_to_unicode().values():
        vocab[character] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                           special_tokens=[("<s>", vocab["<s>"])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                        unk_token="<unk>", pad_token="<pad>",
                                        additional_special_tokens=list(MISTRAL_CONTROL_TOKENS[3:10]))
    tokenizer.chat_template = MISTRAL_CHAT_TEMPLATE
    return tokenizer


def _mistral3(tokenizer, seed: int):
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    token = tokenizer.convert_tokens_to_ids
    text = dict(
        model_type="mistral", vocab_size=padded(len(tokenizer)), hidden_size=TEXT_HIDDEN, intermediate_size=32,
        num_hidden_layers=TEXT_ENCODER_LAYERS, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
        max_position_embeddings=1024, sliding_window=None, bos_token_id=token("<s>"), eos_token_id=token("</s>"),
        pad_token_id=token("<pad>"), rope_parameters={"rope_type": "default", "rope_theta": 1e9},
    )  # fmt: skip
    vision = dict(model_type="pixtral", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, head_dim=8, image_size=32, patch_size=8)
    config = Mistral3Config(text_config=text, vision_config=vision, image_token_index=token("[IMG]"),
                            spatial_merge_size=2)
    with seeded(seed):
        return Mistral3ForConditionalGeneration(config)


def build_tiny_flux2_dev(root: Path, seed: int = 0) -> Path:
    """Writes a tiny FLUX.2 [dev] repo at ``root/black-forest-labs/FLUX.2-dev`` and returns its folder (float32).

    Seeds: ``seed`` for the text encoder, ``seed + 1`` for the transformer, ``seed + 2`` for the VAE.
    """
    repo = prepare_repo(root, FLUX2_DEV_MODEL_ID)
    tokenizer = build_mistral_tokenizer()
    tokenizer.save_pretrained(repo / "tokenizer")
    write_json(repo / "tokenizer" / "processor_config.json", PIXTRAL_PROCESSOR_CONFIG)
    write_json(repo / "tokenizer" / "preprocessor_config.json", PIXTRAL_PREPROCESSOR_CONFIG)
    _mistral3(tokenizer, seed).save_pretrained(repo / "text_encoder", max_shard_size=SHARD_SIZE)
    write_flux2_transformer(repo / "transformer", seed + 1, DOUBLE_BLOCKS, SINGLE_BLOCKS, TEXT_HIDDEN,
                            guidance_embeds=True)
    write_flux2_vae(repo / "vae", seed + 2)
    write_json(repo / "scheduler" / "scheduler_config.json", FLUX2_SCHEDULER_CONFIG)
    write_json(repo / "model_index.json", model_index("Flux2Pipeline", _COMPONENTS))
    return repo
