"""Qwen-Image EliGen: entity-level regional prompts (``eligen_entity_prompts``, ``eligen_entity_masks``) on diffusers'
``QwenImageTransformer2DModel``.

The reference implementation (DiffSynth-Studio's ``QwenImageDiT.process_entity_masks``) conditions one image on
several prompts, each confined to a region:

- Each entity prompt is encoded on its own, with the text-to-image template and nothing cut but the tokenizer's 1024
  tokens, and the text stream is the entity prompts in order, then the global prompt.
- Every text segment gets the rotary positions a prompt alone would get: each starts where the image's positions end.
- The joint attention is masked: the tokens of one text segment see only their own segment; an entity's tokens and
  the image tokens of its region see each other (a 2x2 patch token is in a region when any of its latent cells is);
  the global prompt and the image see each other everywhere, and image tokens see every image token. Image tokens
  beyond the generated image's (edit images) repeat the generated image's regions, as the reference tiles them.
- A mask is read at the latents' size (nearest-neighbour resize to ``height / 8 x width / 8``): a cell is in the
  region when the mean of its RGB values, scaled to ``[-1, 1]``, is above 0.
- The negative CFG branch runs without entities, unless ``eligen_enable_on_negative``: then every entity's text is
  the negative prompt's embedding, over the same regions.

diffusers' attention processor takes no attention mask and gives all text one run of positions, so the entity pass
goes through ``EntityAttnProcessor``: installed on the transformer's attention layers on first use, it computes what
diffusers' ``QwenDoubleStreamAttnProcessor2_0`` computes, with the mask and the text positions above, and hands any
call without entity inputs to diffusers' processor unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from PIL import Image

from ...diffusion.base_pipeline import PipelineUnit

if TYPE_CHECKING:
    from .pipeline import QwenImagePipeline

#: The state inputs a row or a call gives EliGen, in the reference's names.
ENTITY_INPUTS = ("eligen_entity_prompts", "eligen_entity_masks")


def entity_lists(prompts: str | Sequence[str] | None, masks: Image.Image | Sequence[Image.Image] | None
                 ) -> tuple[list[str], list[Image.Image]]:
    """``prompts`` (strings) and ``masks`` (PIL images) as two lists of one length, a single value as a list of one
    and None as an empty list.

    Raises:
        ValueError: A prompt that is not a non-empty string, a mask that is not an image, or lists of two lengths.
    """
    prompts = [prompts] if isinstance(prompts, str) else list(prompts or ())
    masks = [masks] if isinstance(masks, Image.Image) else list(masks or ())
    if not all(isinstance(prompt, str) and prompt.strip() for prompt in prompts):
        raise ValueError(f"eligen_entity_prompts={prompts!r} must be a list of non-empty prompts, one per entity "
                         "mask, e.g. ['a red hat', 'a blue scarf']")
    if not all(isinstance(mask, Image.Image) for mask in masks):
        raise ValueError(f"eligen_entity_masks={masks!r} must be a list of PIL images, one per entity prompt (white "
                         "where the entity goes); in training, name the column in --data_file_keys")
    if len(prompts) != len(masks):
        raise ValueError(f"{len(prompts)} eligen_entity_prompts and {len(masks)} eligen_entity_masks: give one mask "
                         "per entity prompt")
    return prompts, masks


def latent_masks(pipe: QwenImagePipeline, masks: Sequence[Image.Image], height: int, width: int) -> torch.Tensor:
    """The entity masks on the latent grid: ``(1, entities, height / 8, width / 8)`` bools (see the module
    docstring; the arithmetic runs in the pipeline's dtype, as the reference's)."""
    scale, grids = pipe.pixels_per_latent, []
    for mask in masks:
        small = mask.convert("RGB").resize((width // scale, height // scale), Image.Resampling.NEAREST)
        values = torch.from_numpy(np.asarray(small, dtype=np.float32)).to(pipe.torch_dtype) * (2 / 255) - 1
        grids.append(values.mean(dim=-1) > 0)
    return torch.stack(grids).unsqueeze(0).to(pipe.device)


class EntityPromptUnit(PipelineUnit):
    """Encodes the entity prompts (each alone, up to the tokenizer's 1024 tokens) and reads the entity masks.

    Outputs per CFG branch ``entity_prompt_emb`` (a list of ``(1, tokens, dim)`` embeddings) and ``entity_masks``
    (``(1, entities, h, w)`` bools), both None without entities. The negative pass is told apart by its missing
    ``prompt`` (its text is ``negative_prompt``); it gets entities only with ``eligen_enable_on_negative``, each with
    the negative prompt's embedding.
    """

    def __init__(self) -> None:
        branch = {"prompt": "prompt", "prompt_emb": "prompt_emb"}
        super().__init__(separate_cfg=True, input_params=(*ENTITY_INPUTS, "eligen_enable_on_negative", "height",
                                                          "width"),
                         input_params_posi=branch, input_params_nega=branch,
                         output_params=("entity_prompt_emb", "entity_masks"), onload_model_names=("text_encoder",))

    def process(self, pipe: QwenImagePipeline, eligen_entity_prompts: Sequence[str] | None,
                eligen_entity_masks: Sequence[Image.Image] | None, eligen_enable_on_negative: bool | None,
                height: int, width: int, prompt: str | None, prompt_emb: torch.Tensor) -> dict:
        prompts, masks = entity_lists(eligen_entity_prompts, eligen_entity_masks)
        negative = prompt is None
        if not prompts or (negative and not eligen_enable_on_negative):
            return {"entity_prompt_emb": None, "entity_masks": None}
        if negative:
            embeddings = [prompt_emb] * len(prompts)
        else:
            embeddings = [pipe.encode_prompt(text, None)[0] for text in prompts]
        return {"entity_prompt_emb": embeddings, "entity_masks": latent_masks(pipe, masks, height, width)}


@dataclass(frozen=True)
class EntityAttention:
    """What ``EntityAttnProcessor`` needs besides diffusers' arguments: the joint ``(1, 1, S, S)`` bool mask (True:
    may attend) over ``[text, image]`` and the text stream's rotary frequencies."""

    mask: torch.Tensor
    text_freqs: torch.Tensor


def entity_attention_mask(masks: torch.Tensor, text_lengths: Sequence[int], image_tokens: int) -> torch.Tensor:
    """The joint attention mask of the module docstring, ``(1, 1, S, S)`` bools over ``[text, image]``.

    Args:
        masks: ``(1, entities, h, w)`` latent-grid masks.
        text_lengths: Tokens of each entity prompt, then of the global prompt.
        image_tokens: Image tokens in the joint sequence, a multiple of ``h / 2 * w / 2``.
    """
    _, entities, height, width = masks.shape
    patches = masks.reshape(entities, height // 2, 2, width // 2, 2).any(dim=4).any(dim=2).reshape(entities, -1)
    if image_tokens % patches.shape[1]:
        raise ValueError(f"EliGen masks cover {patches.shape[1]} image tokens, which do not tile the {image_tokens} "
                         "the transformer reads; give edit images the output's size")
    regions = torch.cat([patches, patches.new_ones(1, patches.shape[1])]).repeat(1, image_tokens // patches.shape[1])
    segment = torch.repeat_interleave(torch.arange(len(text_lengths), device=masks.device),
                                      torch.tensor(text_lengths, device=masks.device))
    text_text = segment[:, None] == segment[None, :]
    text_image = regions[segment]
    image_image = text_image.new_ones(image_tokens, image_tokens)
    joint = torch.cat([torch.cat([text_text, text_image], dim=1), torch.cat([text_image.T, image_image], dim=1)])
    return joint[None, None]


def entity_inputs(dit: torch.nn.Module, prompt_emb: torch.Tensor, prompt_emb_mask: torch.Tensor | None,
                  entity_prompt_emb: Sequence[torch.Tensor], entity_masks: torch.Tensor,
                  img_shapes: list, image_tokens: int) -> tuple[torch.Tensor, dict[str, Any]]:
    """The transformer's text stream (entity prompts, then the prompt) and the ``attention_kwargs`` that carry the
    mask and text positions to ``EntityAttnProcessor``, which this installs on ``dit`` if it is not there yet.

    Raises:
        ValueError: A batch of several samples (EliGen's mask is one sample's).
    """
    if prompt_emb.shape[0] != 1 or prompt_emb_mask is not None and not bool(prompt_emb_mask.all()):
        raise ValueError(f"EliGen entity inputs condition one sample at a time, not a batch of {prompt_emb.shape[0]}; "
                         "train them with --batch_size 1")
    install_entity_attention(dit)
    segments = [*entity_prompt_emb, prompt_emb]
    lengths = [segment.shape[1] for segment in segments]
    # Every segment starts at the position a lone prompt would: the first rows of the longest one's frequencies.
    freqs = dit.pos_embed(img_shapes, max_txt_seq_len=max(lengths), device=prompt_emb.device)[1]
    text_freqs = torch.cat([freqs[:length] for length in lengths])
    mask = entity_attention_mask(entity_masks, lengths, image_tokens)
    text = torch.cat([segment.to(prompt_emb.dtype) for segment in segments], dim=1)
    return text, {"eligen": EntityAttention(mask, text_freqs)}


def install_entity_attention(dit: torch.nn.Module) -> None:
    """Wraps each joint attention layer's processor of ``dit`` in ``EntityAttnProcessor`` (once)."""
    for block in dit.transformer_blocks:
        if not isinstance(block.attn.processor, EntityAttnProcessor):
            block.attn.set_processor(EntityAttnProcessor(block.attn.processor))


class EntityAttnProcessor:
    """diffusers' Qwen-Image joint attention with EliGen's mask and text positions (``eligen``); without ``eligen``
    the wrapped processor runs as it is, so a transformer with it installed computes as before."""

    def __init__(self, plain: Any) -> None:
        self.plain = plain

    def __call__(self, attn: torch.nn.Module, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                 encoder_hidden_states_mask: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                 image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
                 eligen: EntityAttention | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if eligen is None:
            return self.plain(attn, hidden_states, encoder_hidden_states, encoder_hidden_states_mask,
                              attention_mask, image_rotary_emb)
        # diffusers is imported with the models, not with this module (importing the pipeline stays cheap).
        from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

        head_dim = attn.inner_dim // attn.heads
        streams = []
        for states, projections, norms, freqs in (
                (encoder_hidden_states, (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj),
                 (attn.norm_added_q, attn.norm_added_k), eligen.text_freqs),
                (hidden_states, (attn.to_q, attn.to_k, attn.to_v), (attn.norm_q, attn.norm_k), image_rotary_emb[0])):
            query, key, value = (projection(states).unflatten(-1, (-1, head_dim)) for projection in projections)
            query, key = (norm(x) if norm is not None else x for norm, x in zip(norms, (query, key)))
            query, key = (apply_rotary_emb_qwen(x, freqs, use_real=False) for x in (query, key))
            streams.append((query, key, value))
        query, key, value = (torch.cat(parts, dim=1).transpose(1, 2) for parts in zip(*streams))
        joint = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=eligen.mask)
        joint = joint.transpose(1, 2).flatten(2, 3).to(query.dtype)
        text_tokens = encoder_hidden_states.shape[1]
        image = attn.to_out[0](joint[:, text_tokens:].contiguous())
        if len(attn.to_out) > 1:
            image = attn.to_out[1](image)
        return image, attn.to_add_out(joint[:, :text_tokens].contiguous())
