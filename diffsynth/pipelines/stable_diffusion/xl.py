"""Stable Diffusion XL text-to-image: the SD 1.x pipeline with a second text encoder and the added time ids.

Models, by pipeline name (the reference's): ``unet`` (``UNet2DConditionModel`` with ``addition_embed_type``
``text_time``), ``text_encoder`` (``CLIPTextModel``), ``text_encoder_2`` (``CLIPTextModelWithProjection``), ``vae``,
``tokenizer`` and ``tokenizer_2``. The computation follows diffusers' ``StableDiffusionXLPipeline`` with a
``DDIMScheduler``: each encoder's second-to-last hidden states, concatenated, are the context, the second encoder's
projected output the pooled embedding; the UNet also reads the time ids ``(height, width, 0, 0, height, width)`` (the
original size, the crop's top-left corner, the target size); an empty negative prompt is all zeros, as the release's
``force_zeros_for_empty_prompt`` asks; a VAE whose config says ``force_upcast`` decodes float16 latents in float32.
"""

from __future__ import annotations

from typing import Any

import torch

from ...core.loader import ModelConfig
from ..common import (
    ImageNoiseUnit,
    InputImageEmbedderUnit,
    LatentsUnit,
    PromptUnit,
    SecondTokenizerPipeline,
    ShapeCheckUnit,
)
from .pipeline import StableDiffusionPipeline

__all__ = ["StableDiffusionXLPipeline"]

SDXL_MODEL_ID = "stabilityai/stable-diffusion-xl-base-1.0"


def _encode(tokenizer: Any, text_encoder: torch.nn.Module, prompt: str, device: torch.device) -> Any:
    tokens = tokenizer([prompt], padding="max_length", max_length=tokenizer.model_max_length, truncation=True,
                       return_tensors="pt")
    return text_encoder(tokens.input_ids.to(device), output_hidden_states=True)


class XLPromptEmbedderUnit(PromptUnit):
    """Encodes the prompt with both CLIP encoders (padded to 77 tokens): ``prompt_emb`` is their second-to-last
    hidden states side by side, ``pooled_prompt_emb`` the second's projected output. An empty prompt (the default
    negative one) is zeros of those shapes, as diffusers' ``force_zeros_for_empty_prompt``."""

    shared_inputs = ()
    outputs = ("prompt_emb", "pooled_prompt_emb")
    encoders = ("text_encoder", "text_encoder_2")
    text_encoder_entry = f"{SDXL_MODEL_ID}:text_encoder/model.safetensors"

    def process(self, pipe: StableDiffusionXLPipeline, prompt: str | None) -> dict:
        self.require_text_encoder(pipe)
        if pipe.text_encoder_2 is None or pipe.tokenizer_2 is None:
            raise ValueError("SDXL encodes a prompt with its second text encoder too; add "
                             f"'{SDXL_MODEL_ID}:text_encoder_2/model.safetensors' to the model configs")
        first = _encode(pipe.tokenizer, pipe.text_encoder, prompt or "", pipe.device)
        second = _encode(pipe.tokenizer_2, pipe.text_encoder_2, prompt or "", pipe.device)
        emb = torch.cat([first.hidden_states[-2], second.hidden_states[-2]], dim=-1)
        pooled = second[0]
        if not prompt:
            emb, pooled = torch.zeros_like(emb), torch.zeros_like(pooled)
        return {"prompt_emb": emb.to(pipe.torch_dtype), "pooled_prompt_emb": pooled.to(pipe.torch_dtype)}


class StableDiffusionXLPipeline(SecondTokenizerPipeline, StableDiffusionPipeline):
    """Stable Diffusion XL generation and the computation its training shares; called as
    ``StableDiffusionPipeline`` (``cfg_scale`` default 5, size 1024)."""

    model_roles = {**StableDiffusionPipeline.model_roles, "CLIPTextModelWithProjection": "text_encoder_2"}
    default_tokenizer_config = ModelConfig(model_id=SDXL_MODEL_ID, origin_file_pattern="tokenizer/")
    default_tokenizer_2_config = ModelConfig(model_id=SDXL_MODEL_ID, origin_file_pattern="tokenizer_2/")
    model_fn_params = ("prompt_emb", "pooled_prompt_emb")
    #: The layer kinds the reference's SDXL LoRA script lists one by one (every transformer block's). An empty
    #: ``--lora_target_modules`` is refused: every Linear would include ``add_embedding``, whose kohya name
    #: diffusers' converter misreads.
    default_lora_target_modules = "to_q,to_k,to_v,to_out.0,proj_in,proj_out,ff.net.0.proj,ff.net.2"
    empty_lora_targets_train_all_linear = False
    default_size = 1024
    default_cfg_scale = 5.0
    unit_classes = (ShapeCheckUnit, ImageNoiseUnit, InputImageEmbedderUnit, LatentsUnit, XLPromptEmbedderUnit)

    def model_fn(self, latents: torch.Tensor, timestep: torch.Tensor | float, prompt_emb: torch.Tensor,
                 pooled_prompt_emb: torch.Tensor | None = None, **_: Any) -> torch.Tensor:
        """The UNet's prediction for ``(B, 4, h, w)`` ``latents``, with the pooled embedding and the time ids of an
        uncropped ``8h x 8w`` image."""
        batch = latents.shape[0]
        timestep = torch.as_tensor(timestep, device=latents.device).reshape(-1).expand(batch)
        context = prompt_emb.expand(batch, -1, -1) if prompt_emb.shape[0] == 1 else prompt_emb
        pooled = pooled_prompt_emb.expand(batch, -1) if pooled_prompt_emb.shape[0] == 1 else pooled_prompt_emb
        height, width = (side * self.pixels_per_latent for side in latents.shape[-2:])
        time_ids = torch.tensor([[height, width, 0, 0, height, width]], dtype=context.dtype,
                                device=latents.device).expand(batch, -1)
        return self.unet(latents, timestep, encoder_hidden_states=context, return_dict=False,
                         added_cond_kwargs={"text_embeds": pooled, "time_ids": time_ids})[0]

    def decode(self, inputs_shared: dict, inputs_posi: dict, inputs_nega: dict) -> torch.Tensor:
        """As SD 1.x; a float16 VAE whose config says ``force_upcast`` (SDXL's overflows in float16) decodes in
        float32 and goes back to float16."""
        if not (self.vae.dtype == torch.float16 and getattr(self.vae.config, "force_upcast", False)):
            return super().decode(inputs_shared, inputs_posi, inputs_nega)
        self.vae.to(torch.float32)
        try:
            return super().decode(inputs_shared, inputs_posi, inputs_nega)
        finally:
            self.vae.to(torch.float16)
