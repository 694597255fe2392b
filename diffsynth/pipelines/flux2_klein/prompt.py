"""FLUX.2's prompt embedding, for both of its text encoders, as diffusers computes it.

- FLUX.2 [klein] (``Qwen3ForCausalLM``, diffusers' ``Flux2KleinPipeline``): the prompt as the user turn of Qwen3's chat
  template with the assistant's turn opened and thinking off; the hidden states after layers 9, 18 and 27.
- FLUX.2 [dev] (``Mistral3ForConditionalGeneration``, diffusers' ``Flux2Pipeline``): BFL's system message, then the
  prompt as the user turn (``[IMG]`` removed from it, as diffusers does), no assistant turn; the hidden states after
  layers 10, 20 and 30.

Either way the prompt is padded to ``max_sequence_length`` tokens and the three layers' states are laid side by side
per token, padding tokens included (diffusers passes them all to the transformer, unmasked).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..common import PromptUnit

if TYPE_CHECKING:
    from .pipeline import Flux2KleinPipeline

__all__ = ["PromptEmbedderUnit", "MISTRAL_SYSTEM_MESSAGE"]

TOKENIZER_MAX_LENGTH = 512
DEV_TEXT_ENCODER_ENTRY = "black-forest-labs/FLUX.2-dev:text_encoder/*.safetensors"
# diffusers' SYSTEM_MESSAGE (pipelines/flux2/system_messages.py), line break included; DiffSynth-Studio's copy joins the
# two lines with a space instead, so its [dev] prompt embeddings differ from diffusers' by that one token.
MISTRAL_SYSTEM_MESSAGE = ("You are an AI that reasons about image descriptions. You give structured responses focusing "
                          "on object relationships, object\nattribution and actions without speculation.")


def qwen3_tokens(tokenizer: Any, prompt: str, max_length: int) -> Any:
    """FLUX.2 [klein]'s prompt tokens: the user turn of Qwen3's chat template, thinking off."""
    messages = [{"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    return tokenizer(text, return_tensors="pt", padding="max_length", truncation=True, max_length=max_length)


@functools.cache
def processor_chat_template(folder: str) -> str | None:
    """The chat template a processor loads from ``folder``: ``chat_template.jinja``, else the legacy
    ``chat_template.json``'s; None when it holds neither (or is no folder)."""
    if not folder:
        return None
    jinja, legacy = Path(folder, "chat_template.jinja"), Path(folder, "chat_template.json")
    if jinja.is_file():
        return jinja.read_text()
    return json.loads(legacy.read_text())["chat_template"] if legacy.is_file() else None


def mistral3_tokens(tokenizer: Any, prompt: str, max_length: int) -> Any:
    """FLUX.2 [dev]'s prompt tokens: BFL's system message and the user turn.

    diffusers reads the tokenizer folder as a Pixtral processor (which needs torchvision); here it is a tokenizer,
    given the processor's chat template from its folder, since the tokenizer's own (if any) may be the text-only one,
    which renders the message parts differently.
    """
    messages = [[{"role": "system", "content": [{"type": "text", "text": MISTRAL_SYSTEM_MESSAGE}]},
                 {"role": "user", "content": [{"type": "text", "text": prompt.replace("[IMG]", "")}]}]]
    template = processor_chat_template(str(getattr(tokenizer, "name_or_path", "") or ""))
    return tokenizer.apply_chat_template(messages, chat_template=template, add_generation_prompt=False, tokenize=True,
                                         return_dict=True, return_tensors="pt", padding="max_length",
                                         truncation=True, max_length=max_length)


# Per text encoder class: how its prompt is tokenized, the hidden states stacked, and the release it comes with.
ENCODERS = {
    "Qwen3ForCausalLM": (qwen3_tokens, (9, 18, 27), "a FLUX.2 [klein] repository"),
    "Mistral3ForConditionalGeneration": (mistral3_tokens, (10, 20, 30), "black-forest-labs/FLUX.2-dev"),
}


class PromptEmbedderUnit(PromptUnit):
    """Encodes the prompt (and, with CFG, the negative prompt) with the loaded text encoder.

    Outputs ``prompt_emb``, ``(1, max_sequence_length, 3 * hidden)``.
    """

    text_encoder_entry = "black-forest-labs/FLUX.2-klein-4B:text_encoder/*.safetensors"

    def process(self, pipe: Flux2KleinPipeline, prompt: str | None, max_sequence_length: int | None) -> dict:
        dev = pipe.dit is not None and pipe.dit.config.guidance_embeds
        self.require_text_encoder(pipe, DEV_TEXT_ENCODER_ENTRY if dev else None)
        tokenize, layers, release = ENCODERS[type(pipe.text_encoder).__name__]
        tokens = tokenize(pipe.tokenizer, prompt or "", max_sequence_length or TOKENIZER_MAX_LENGTH)
        hidden = pipe.text_encoder(input_ids=tokens["input_ids"].to(pipe.device),
                                   attention_mask=tokens["attention_mask"].to(pipe.device),
                                   output_hidden_states=True, use_cache=False).hidden_states
        if len(hidden) <= max(layers):
            raise ValueError(f"the text encoder has {len(hidden) - 1} layers; FLUX.2 reads the hidden states of layers "
                             f"{layers}: load the {type(pipe.text_encoder).__name__} text encoder of {release}")
        stacked = torch.stack([hidden[index] for index in layers], dim=2)  # (B, L, 3, D)
        return {"prompt_emb": stacked.flatten(2).to(pipe.torch_dtype)}
