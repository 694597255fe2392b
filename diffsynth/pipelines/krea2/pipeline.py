"""Krea 2 (Krea-2-Raw and Krea-2-Turbo) text-to-image as declared units over the diffusers / transformers models.

Models, by pipeline name: ``dit`` (``Krea2Transformer2DModel``, from Krea's ``raw.safetensors`` /
``turbo.safetensors`` through ``original.py`` or a diffusers folder), ``vae`` (Qwen-Image's ``AutoencoderKLQwenImage``),
``text_encoder`` (Qwen3-VL-4B-Instruct: ``Qwen3VLForConditionalGeneration`` as released, or diffusers'
``Qwen3VLModel``) and ``tokenizer``. The computation follows diffusers' ``Krea2Pipeline`` step for step:

- the prompt goes after Qwen-Image's system prefix, is padded to a fixed length and followed by the assistant
  suffix (``[prefix | prompt | pad | suffix]``); the encoder reads positions that count real tokens only, and every
  third hidden state counted back from the second-to-last (12 of Qwen3-VL-4B's: 2, 5, ..., 35) is stacked per token;
  the first 34 tokens (the prefix) are dropped, the rest kept with their mask;
- the transformer reads 2x2-packed latents, the stacked taps with their mask, ``(0, row, col)`` rotary positions for
  the image tokens (zeros for the text) and the time ``sigma``; its output is the velocity;
- latents are normalised with the VAE's ``latents_mean`` / ``latents_std``; the schedule is flow-match Euler on
  ``linspace(1, 1/N, N)`` with the exponential shift ``mu``: Raw's grows with the token count (0.5 at 256 tokens,
  1.15 at 6400), Turbo's is fixed at 1.15 (the reference's ``mu=1.15``, diffusers' ``is_distilled``).

CFG: ``cfg_scale`` follows the reference (``negative + cfg_scale * (positive - negative)``, 1 is off), which is
diffusers' ``guidance_scale + 1``. Training draws timesteps from the reference's grid (``mu`` 0.8).
"""

from __future__ import annotations

from typing import Any

import torch
from PIL import Image

from ...core.loader import ModelConfig
from ...core.loader.resolve import REPOSITORY_ROOT
from ..common import (
    ImageNoiseUnit,
    InputImageEmbedderUnit,
    LatentsUnit,
    PromptUnit,
    ShapeCheckUnit,
    TextToLatentPipeline,
    check_call_inputs,
    pack_latents,
    prompt_only_problems,
    unpack_latents,
    vision_language_model,
)
from ..qwen_image.pipeline import QwenImagePipeline

__all__ = ["Krea2Pipeline", "ModelConfig", "text_encoder_taps"]

DEFAULT_SIZE = 1024
TOKENIZER_MAX_LENGTH = 512
# Turbo's fixed shift (diffusers' is_distilled; the reference's Turbo example passes mu=1.15).
DISTILLED_MU = 1.15
# Qwen-Image's prompt template, as diffusers' Krea2Pipeline writes it: the prefix's 34 tokens (Qwen's tokenizer) are
# dropped from the encoder's output; the 5 suffix tokens are counted inside the fixed length.
PROMPT_PREFIX = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
                 "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n")
PROMPT_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
PREFIX_TOKENS = 34
SUFFIX_TOKENS = 5

MODEL_ROLES = {
    "Krea2Transformer2DModel": "dit",
    "AutoencoderKLQwenImage": "vae",
    "Qwen3VLForConditionalGeneration": "text_encoder",
    "Qwen3VLModel": "text_encoder",
}


def text_encoder_taps(num_layers: int) -> tuple[int, ...]:
    """The encoder's hidden states the transformer reads: every third counted back from the second-to-last layer's
    output (index 0 is the embeddings): Qwen3-VL-4B's 36 layers give diffusers' 12 taps 2, 5, ..., 35."""
    return tuple(range((num_layers - 1) % 3, num_layers, 3))


class PromptEmbedderUnit(PromptUnit):
    """Encodes the prompt (and, with CFG, the negative prompt) with Qwen3-VL as diffusers' ``Krea2Pipeline`` does.

    Outputs ``prompt_emb`` ``(1, tokens, taps, hidden)`` and its boolean ``prompt_emb_mask`` ``(1, tokens)``; the
    length is fixed by ``max_sequence_length``, so batches need no padding.
    """

    outputs = ("prompt_emb", "prompt_emb_mask")
    text_encoder_entry = "Qwen/Qwen3-VL-4B-Instruct:*.safetensors"

    def process(self, pipe: Krea2Pipeline, prompt: str | None, max_sequence_length: int | None) -> dict:
        self.require_text_encoder(pipe)
        length = max_sequence_length or TOKENIZER_MAX_LENGTH
        text = pipe.tokenizer([PROMPT_PREFIX + (prompt or "")], truncation=True, padding="max_length",
                              max_length=length + PREFIX_TOKENS - SUFFIX_TOKENS, return_tensors="pt")
        suffix = pipe.tokenizer([PROMPT_SUFFIX], return_tensors="pt")
        input_ids = torch.cat([text.input_ids, suffix.input_ids], dim=1).to(pipe.device)
        mask = torch.cat([text.attention_mask, suffix.attention_mask], dim=1).bool().to(pipe.device)
        # Padding sits before the suffix: positions count real tokens only, on all three mRoPE axes.
        positions = (mask.long().cumsum(dim=-1) - 1).clamp(min=0).unsqueeze(0).expand(3, -1, -1)
        encoder = vision_language_model(pipe.text_encoder)
        hidden = encoder(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                         output_hidden_states=True).hidden_states
        taps = text_encoder_taps(len(hidden) - 1)
        if pipe.dit is not None and len(taps) != pipe.dit.config.num_text_layers:
            raise ValueError(f"the transformer reads {pipe.dit.config.num_text_layers} text-encoder taps, but a text "
                             f"encoder of {len(hidden) - 1} layers gives {len(taps)}; load Qwen3-VL-4B-Instruct, the "
                             "encoder Krea 2 was trained with")
        stacked = torch.stack([hidden[index] for index in taps], dim=2)
        return {"prompt_emb": stacked[:, PREFIX_TOKENS:].to(pipe.torch_dtype),
                "prompt_emb_mask": mask[:, PREFIX_TOKENS:]}


def _is_distilled(config: ModelConfig | None) -> bool:
    """Whether the transformer's files name Turbo (``krea/Krea-2-Turbo``, ``turbo.safetensors``)."""
    if config is None:
        return False
    named = " ".join(str(part) for part in (config.model_id, config.origin_file_pattern, config.path) if part)
    return "turbo" in named.lower()


class Krea2Pipeline(TextToLatentPipeline):
    """Krea-2-Raw / Krea-2-Turbo generation and the computation its training shares.

    Build it with ``from_pretrained``; call it with a prompt to get an image. ``model_fn`` is also what training
    calls, on the state the units produce.
    """

    model_roles = MODEL_ROLES
    default_tokenizer_config = ModelConfig(model_id="Qwen/Qwen3-VL-4B-Instruct", origin_file_pattern=REPOSITORY_ROOT)
    default_lora_target_modules = "to_q,to_k,to_v,to_out.0,to_gate,ff.gate,ff.up,ff.down"
    # The reference's --lora_target_modules name Krea's own modules; "gate" is both the attention's output gate and
    # the MLP's gate projection.
    lora_target_aliases = {
        "wq": "to_q", "wk": "to_k", "wv": "to_v", "wo": "to_out.0", "gate": (r".*\.attn\.to_gate", r".*\.ff\.gate"),
        "up": "ff.up", "down": "ff.down", "first": "img_in", "tmlp.0": "time_embed.linear_1",
        "tmlp.2": "time_embed.linear_2", "projector": "text_fusion.projector", "txtmlp.1": "txt_in.linear_1",
        "txtmlp.3": "txt_in.linear_2", "last.linear": "final_layer.linear", "tproj.1": "time_mod_proj",
    }  # fmt: skip
    #: The reference's --align_to_opensource_format writes diffusers' names under transformer. (Krea's LoRA releases).
    aligned_lora_layout = "diffusers"
    model_fn_params = ("prompt_emb", "prompt_emb_mask")
    #: Every prompt embedding is ``max_sequence_length`` tokens long (padding masked), so batches need no padding.
    padded_inputs: dict[str, str] = {}
    scheduler_preset = "krea2"
    #: Turbo (fixed shift) or Raw (resolution shift); see ``_after_load``.
    extra_attributes = {"is_distilled": False}
    unit_classes = (ShapeCheckUnit, ImageNoiseUnit, InputImageEmbedderUnit, LatentsUnit, PromptEmbedderUnit)
    # Qwen-Image's VAE, normalised the same way.
    encode_image = QwenImagePipeline.encode_image
    decode = QwenImagePipeline.decode

    def _after_load(self, is_distilled: bool | None = None) -> None:
        """Decides the sampling shift.

        Args:
            is_distilled: Whether the transformer is Turbo (fixed ``mu`` 1.15). None: whether its repository id or
                file names Turbo.
        """
        self.is_distilled = is_distilled if is_distilled is not None else _is_distilled(self.model_configs.get("dit"))

    def set_inference_timesteps(self, num_inference_steps: int, denoising_strength: float = 1.0, *,
                                latent_shape: tuple[int, ...], mu: float | None = None) -> None:
        """``mu`` as given, else Turbo's 1.15, else Raw's shift of the token count ``(h / 2) * (w / 2)``."""
        if mu is None and self.is_distilled:
            mu = DISTILLED_MU
        image_seq_len = (latent_shape[-2] // 2) * (latent_shape[-1] // 2)
        self.scheduler.set_timesteps(num_inference_steps, denoising_strength, image_seq_len=image_seq_len, mu=mu)

    def model_fn(self, latents: torch.Tensor, timestep: torch.Tensor | float, prompt_emb: torch.Tensor,
                 prompt_emb_mask: torch.Tensor | None = None, **_: Any) -> torch.Tensor:
        """The velocity for ``(B, 16, h, w)`` ``latents`` at ``timestep`` (scale 0 to 1000).

        Extra state keys are ignored, since the loop passes the whole state.
        """
        batch, _, height, width = latents.shape
        device = latents.device
        timestep = torch.as_tensor(timestep, device=device).to(latents.dtype).reshape(-1).expand(batch)
        text_length = prompt_emb.shape[1]
        image_ids = torch.zeros(height // 2, width // 2, 3, device=device)
        image_ids[..., 1] = torch.arange(height // 2, device=device)[:, None]
        image_ids[..., 2] = torch.arange(width // 2, device=device)[None, :]
        positions = torch.cat([torch.zeros(text_length, 3, device=device), image_ids.reshape(-1, 3)])
        mask = None if prompt_emb_mask is None else prompt_emb_mask.bool().expand(batch, -1)
        prediction = self.dit(hidden_states=pack_latents(latents), timestep=timestep / 1000,
                              encoder_hidden_states=prompt_emb.to(latents.dtype).expand(batch, -1, -1, -1),
                              position_ids=positions, encoder_attention_mask=mask, return_dict=False)[0]
        return unpack_latents(prediction, height, width)

    def sample_input_problems(self, inputs: set[str]) -> list[str]:
        """Krea 2 renders from the prompt alone."""
        return prompt_only_problems("Krea 2", inputs)

    @torch.no_grad()
    def __call__(self, prompt: str, negative_prompt: str = "", cfg_scale: float = 4.5,
                 input_image: Image.Image | None = None, denoising_strength: float = 1.0, height: int | None = None,
                 width: int | None = None, seed: int | None = None, rand_device: str = "cpu",
                 num_inference_steps: int = 52, mu: float | None = None,
                 max_sequence_length: int = TOKENIZER_MAX_LENGTH, output_type: str = "pil",
                 progress_bar: bool = True) -> Image.Image | torch.Tensor:
        """Generates one image.

        Args:
            prompt: What to draw.
            negative_prompt: What to steer away from; used when ``cfg_scale`` is not 1.
            cfg_scale: CFG scale, ``negative + cfg_scale * (positive - negative)``: diffusers' ``guidance_scale`` + 1.
                1 turns CFG off and halves the work per step (Turbo's setting); the reference renders Raw at 4.5.
            input_image: Start from this image instead of pure noise (image-to-image).
            denoising_strength: With ``input_image``: how much of the schedule to run (1 ignores the image).
            height: Output height in pixels, rounded to a multiple of 16; default 1024.
            width: Output width in pixels, rounded to a multiple of 16; default 1024.
            seed: Noise seed; ``None`` draws from torch's global generator.
            rand_device: Device the noise is drawn on (CPU noise is the same on every machine).
            num_inference_steps: Denoising steps (Raw: 28 to 52; Turbo: 8).
            mu: The schedule's exponential shift; None is Turbo's 1.15 or Raw's shift of the resolution.
            max_sequence_length: Prompt tokens the transformer reads (padded or cut to it; at most 512).
            output_type: ``"pil"`` for a PIL image, ``"pt"`` for a ``(1, 3, H, W)`` tensor in ``[0, 1]``.
            progress_bar: Show a progress bar over the steps.
        """
        check_call_inputs(prompt, output_type, max_sequence_length, TOKENIZER_MAX_LENGTH)
        height, width = height or DEFAULT_SIZE, width or DEFAULT_SIZE
        self.set_inference_timesteps(num_inference_steps, denoising_strength,
                                     latent_shape=self.image_latent_shape(height, width), mu=mu)
        inputs_shared = {
            "cfg_scale": cfg_scale, "input_image": input_image, "denoising_strength": denoising_strength,
            "height": height, "width": width, "seed": seed, "rand_device": rand_device,
            "max_sequence_length": max_sequence_length,
        }  # fmt: skip
        images = self.denoise(inputs_shared, {"prompt": prompt}, {"negative_prompt": negative_prompt},
                              progress_bar=progress_bar)
        return self.image_output(images, output_type)
