"""ERNIE-Image and ERNIE-Image-Turbo text-to-image as declared units over the diffusers / transformers models.

Models, by pipeline name: ``dit`` (``ErnieImageTransformer2DModel``), ``vae`` (``AutoencoderKLFlux2``),
``text_encoder`` (``Mistral3Model``, Ministral-3B; its language model runs) and ``tokenizer``. The computation follows
diffusers' ``ErnieImagePipeline`` step for step (without its optional prompt enhancer ``pe``):

- the prompt is tokenized as it is (no template, no padding) and the encoder's second-to-last hidden states are the
  caption;
- the transformer reads the 2x2-patchified latents ``(B, 128, H/16, W/16)``, the caption and its length, and the
  timestep on the 0 to 1000 scale; its output is the velocity;
- latents are normalised with the VAE's batch-norm statistics (epsilon 1e-5, the trained value diffusers uses); the
  schedule is flow-match Euler on ``linspace(1, 0, N + 1)[:-1]`` with a static shift: 3 (the release's and the
  reference's), ERNIE-Image-Turbo samples with ``sigma_shift=4`` in the reference's example.

CFG: ``cfg_scale`` is the reference's and diffusers' ``guidance_scale`` alike (``negative + cfg_scale * (positive -
negative)``, 1 is off).
"""

from __future__ import annotations

from typing import Any

import torch
from PIL import Image

from ...core.loader import ModelConfig
from ..common import (
    ImageNoiseUnit,
    InputImageEmbedderUnit,
    LatentsUnit,
    PromptUnit,
    ShapeCheckUnit,
    TextToLatentPipeline,
    check_call_inputs,
    prompt_only_problems,
)
from ..flux2_klein.pipeline import VAE_SCALE, Flux2KleinPipeline

__all__ = ["ErnieImagePipeline", "ModelConfig"]

DEFAULT_SIZE = 1024
DEFAULT_SHIFT = 3.0
# diffusers' ErnieImagePipeline normalises with this epsilon (the trained value), not the VAE config's.
BATCH_NORM_EPS = 1e-5
# The second-to-last hidden states are the caption.
CAPTION_HIDDEN_LAYER = -2

MODEL_ROLES = {
    "ErnieImageTransformer2DModel": "dit",
    "AutoencoderKLFlux2": "vae",
    "Mistral3Model": "text_encoder",
}


class PromptEmbedderUnit(PromptUnit):
    """Encodes the prompt (and, with CFG, the negative prompt) with the Ministral encoder as diffusers does: the
    tokens as they are (the tokenizer's BOS, or token 0, for an empty prompt), the second-to-last hidden states.

    Outputs ``prompt_emb`` ``(1, tokens, hidden)``; ``prompt_emb_mask`` is None (one prompt has no padding; batches
    pad through ``padded_inputs``).
    """

    shared_inputs = ()
    outputs = ("prompt_emb", "prompt_emb_mask")
    text_encoder_entry = "PaddlePaddle/ERNIE-Image:text_encoder/model.safetensors"

    def process(self, pipe: ErnieImagePipeline, prompt: str | None) -> dict:
        self.require_text_encoder(pipe)
        ids = pipe.tokenizer(prompt or "", add_special_tokens=True, truncation=True, padding=False)["input_ids"]
        if not ids:
            ids = [pipe.tokenizer.bos_token_id if pipe.tokenizer.bos_token_id is not None else 0]
        hidden = pipe.text_encoder(input_ids=torch.tensor([ids], device=pipe.device),
                                   output_hidden_states=True).hidden_states[CAPTION_HIDDEN_LAYER]
        return {"prompt_emb": hidden.to(pipe.torch_dtype), "prompt_emb_mask": None}


class ErnieImagePipeline(TextToLatentPipeline):
    """ERNIE-Image / ERNIE-Image-Turbo generation and the computation its training shares.

    Build it with ``from_pretrained``; call it with a prompt to get an image. ``model_fn`` is also what training
    calls, on the state the units produce.
    """

    model_roles = MODEL_ROLES
    default_tokenizer_config = ModelConfig(model_id="PaddlePaddle/ERNIE-Image", origin_file_pattern="tokenizer/")
    default_lora_target_modules = "to_q,to_k,to_v,to_out.0"
    model_fn_params = ("prompt_emb", "prompt_emb_mask")
    #: A batch pads prompt embeddings to its longest prompt; ``model_fn`` passes each one's length.
    padded_inputs = {"prompt_emb": "prompt_emb_mask"}
    scheduler_preset = "ernie_image"
    latent_channels = 128
    pixels_per_latent = VAE_SCALE
    #: The state holds patchified latents: one cell is one transformer token.
    latent_patch_size = 1
    unit_classes = (ShapeCheckUnit, ImageNoiseUnit, InputImageEmbedderUnit, LatentsUnit, PromptEmbedderUnit)
    # FLUX.2's VAE, patchified and normalised as FLUX.2 [klein] does (with ERNIE's epsilon, ``latent_statistics``).
    encode_image = Flux2KleinPipeline.encode_image
    decode = Flux2KleinPipeline.decode

    def latent_statistics(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The VAE's batch-norm ``running_mean`` and ``1 / sqrt(running_var + 1e-5)`` over the 128 patchified
        channels, shaped to broadcast over ``like``."""
        bn = self.vae.bn
        shape = (1, -1) + (1,) * (like.dim() - 2)
        mean = bn.running_mean.view(shape).to(like.device, like.dtype)
        std = torch.sqrt(bn.running_var.view(shape) + BATCH_NORM_EPS).to(like.device, like.dtype)
        return mean, 1.0 / std

    def model_fn(self, latents: torch.Tensor, timestep: torch.Tensor | float, prompt_emb: torch.Tensor,
                 prompt_emb_mask: torch.Tensor | None = None, **_: Any) -> torch.Tensor:
        """The velocity for ``(B, 128, h, w)`` patchified ``latents`` at ``timestep`` (scale 0 to 1000).

        ``prompt_emb_mask`` marks a padded batch's real tokens (None: every token is real). Extra state keys are
        ignored, since the loop passes the whole state.
        """
        batch = latents.shape[0]
        timestep = torch.as_tensor(timestep, device=latents.device).to(latents.dtype).reshape(-1).expand(batch)
        text = prompt_emb.to(latents.dtype).expand(batch, -1, -1)
        if prompt_emb_mask is None:
            lengths = torch.full((batch,), text.shape[1], dtype=torch.long, device=latents.device)
        else:
            lengths = prompt_emb_mask.long().sum(dim=1).expand(batch)
        return self.dit(hidden_states=latents, timestep=timestep, text_bth=text, text_lens=lengths,
                        return_dict=False)[0]

    def sample_input_problems(self, inputs: set[str]) -> list[str]:
        """ERNIE-Image renders from the prompt alone."""
        return prompt_only_problems("ERNIE-Image", inputs)

    @torch.no_grad()
    def __call__(self, prompt: str, negative_prompt: str = "", cfg_scale: float = 4.0,
                 input_image: Image.Image | None = None, denoising_strength: float = 1.0, height: int | None = None,
                 width: int | None = None, seed: int | None = None, rand_device: str = "cpu",
                 num_inference_steps: int = 50, sigma_shift: float = DEFAULT_SHIFT, output_type: str = "pil",
                 progress_bar: bool = True) -> Image.Image | torch.Tensor:
        """Generates one image.

        Args:
            prompt: What to draw.
            negative_prompt: What to steer away from; used when ``cfg_scale`` is not 1.
            cfg_scale: CFG scale, ``negative + cfg_scale * (positive - negative)`` (diffusers' ``guidance_scale``);
                1 turns CFG off (Turbo's setting).
            input_image: Start from this image instead of pure noise (image-to-image).
            denoising_strength: With ``input_image``: how much of the schedule to run (1 ignores the image).
            height: Output height in pixels, rounded to a multiple of 16; default 1024.
            width: Output width in pixels, rounded to a multiple of 16; default 1024.
            seed: Noise seed; ``None`` draws from torch's global generator.
            rand_device: Device the noise is drawn on (CPU noise is the same on every machine).
            num_inference_steps: Denoising steps (ERNIE-Image: 50; Turbo: 8).
            sigma_shift: The schedule's static shift (3; the reference renders Turbo with 4).
            output_type: ``"pil"`` for a PIL image, ``"pt"`` for a ``(1, 3, H, W)`` tensor in ``[0, 1]``.
            progress_bar: Show a progress bar over the steps.
        """
        check_call_inputs(prompt, output_type)
        if sigma_shift <= 0:
            raise ValueError(f"sigma_shift={sigma_shift} must be positive; use 3.0 (ERNIE-Image) or 4.0 (Turbo)")
        height, width = height or DEFAULT_SIZE, width or DEFAULT_SIZE
        self.scheduler.shift = float(sigma_shift)
        self.set_inference_timesteps(num_inference_steps, denoising_strength,
                                     latent_shape=self.image_latent_shape(height, width))
        inputs_shared = {
            "cfg_scale": cfg_scale, "input_image": input_image, "denoising_strength": denoising_strength,
            "height": height, "width": width, "seed": seed, "rand_device": rand_device,
        }  # fmt: skip
        images = self.denoise(inputs_shared, {"prompt": prompt}, {"negative_prompt": negative_prompt},
                              progress_bar=progress_bar)
        return self.image_output(images, output_type)
