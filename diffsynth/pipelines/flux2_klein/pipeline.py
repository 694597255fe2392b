"""FLUX.2 [klein] (4B, 9B and their base models) and FLUX.2 [dev] text-to-image and multi-reference editing as
declared units over the diffusers / transformers models.

Models, by pipeline name: ``dit`` (``Flux2Transformer2DModel``), ``vae`` (``AutoencoderKLFlux2``), ``text_encoder``
(``Qwen3ForCausalLM`` for klein, ``Mistral3ForConditionalGeneration`` for dev) and ``tokenizer``. The computation
follows diffusers' ``Flux2KleinPipeline`` and ``Flux2Pipeline`` step for step:

- the prompt goes through the text encoder's chat template, padded to ``max_sequence_length`` tokens, and three of its
  hidden states are stacked per token into one embedding of three times the encoder's width (``prompt.py``);
- the VAE's 32-channel latents are patchified 2x2 into 128 channels and normalised with the VAE's batch-norm
  statistics; the state keeps them as ``(batch, 128, height / 16, width / 16)``;
- every token has a 4-D position ``(t, h, w, l)``: text tokens ``(0, 0, 0, l)``, image tokens ``(0, h, w, 0)``, and
  the i-th reference image's tokens ``(10 + 10 i, h, w, 0)``, appended after the image's tokens (the prediction for
  them is dropped, so they only condition the model and the training loss covers the generated image alone);
- the schedule is ``linspace(1, 1/N, N)`` bent by the exponential shift with FLUX.2's empirical ``mu``, which depends on
  the token count and the number of steps (``flux2_empirical_mu``); training draws from the 1000-step grid bent at
  ``mu`` 0.8, the reference trainer's choice;
- the step-distilled klein-4B / 9B run without CFG (a scale above 1 is ignored, as diffusers does); the base models use
  CFG with an empty negative prompt (``negative_prompt`` may change it here);
- the guidance-distilled dev transformer takes the guidance scale as an input (``embedded_guidance``, diffusers'
  ``guidance_scale``, 4 by default) and runs without CFG unless ``cfg_scale`` is set above 1 (diffusers has no CFG
  for it; the reference trainer's pipeline has). Training feeds it ``embedded_guidance`` 1, as the reference trains.

Reference images are ``edit_image`` (diffusers calls them ``image``): each is shrunk to at most 1024 x 1024 pixels,
its sides cut down to multiples of 16 by a centre crop, encoded like the target image, and given its own positions.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from typing import Any

import torch
from PIL import Image

from ...core.data.cells import real
from ...core.loader import ModelConfig, model_class_name, resolve_files
from ...diffusion.base_pipeline import PipelineUnit
from ..common import TextToLatentPipeline, check_call_inputs, image_list, image_to_tensor, image_units
from .prompt import TOKENIZER_MAX_LENGTH, PromptEmbedderUnit

__all__ = ["Flux2KleinPipeline", "flux2_empirical_mu"]

logger = logging.getLogger(__name__)

VAE_SCALE = 16  # 8x VAE compression times the 2x2 patchify
DEFAULT_SIZE = 1024
# Reference images: the largest area kept, the smallest side and the most extreme aspect ratio diffusers accepts, and
# the time coordinate step between them.
EDIT_IMAGE_MAX_PIXELS = 1024 * 1024
EDIT_IMAGE_MIN_SIDE = 64
EDIT_IMAGE_MAX_ASPECT = 8
EDIT_IMAGE_TIME_STEP = 10
DEFAULT_GUIDANCE = 4.0
TRAINING_GUIDANCE = 1.0

DEV_TOKENIZER = ModelConfig(model_id="black-forest-labs/FLUX.2-dev", origin_file_pattern="tokenizer/")

MODEL_ROLES = {
    "Flux2Transformer2DModel": "dit",
    "AutoencoderKLFlux2": "vae",
    "Qwen3ForCausalLM": "text_encoder",
    "Mistral3ForConditionalGeneration": "text_encoder",
}


def flux2_empirical_mu(image_seq_len: int, num_steps: int) -> float:
    """FLUX.2's exponential-shift ``mu`` for ``image_seq_len`` image tokens sampled in ``num_steps`` steps.

    BFL fitted ``mu`` as a line in the token count at 10 and at 200 steps and interpolates linearly in the step count
    between them; past 4300 tokens the 200-step line alone is used.
    """
    slope_200, intercept_200 = 0.00016927, 0.45666666
    slope_10, intercept_10 = 8.73809524e-05, 1.89833333
    mu_200 = slope_200 * image_seq_len + intercept_200
    if image_seq_len > 4300:
        return float(mu_200)
    mu_10 = slope_10 * image_seq_len + intercept_10
    per_step = (mu_200 - mu_10) / 190.0
    return float(per_step * num_steps + mu_200 - 200.0 * per_step)


def patchify(latents: torch.Tensor) -> torch.Tensor:
    """``(B, C, H, W)`` VAE latents to ``(B, 4C, H/2, W/2)``: each 2x2 patch becomes channels (channel-major)."""
    batch, channels, height, width = latents.shape
    patches = latents.view(batch, channels, height // 2, 2, width // 2, 2).permute(0, 1, 3, 5, 2, 4)
    return patches.reshape(batch, channels * 4, height // 2, width // 2)


def unpatchify(latents: torch.Tensor) -> torch.Tensor:
    """Inverse of ``patchify``."""
    batch, channels, height, width = latents.shape
    patches = latents.reshape(batch, channels // 4, 2, 2, height, width).permute(0, 1, 4, 2, 5, 3)
    return patches.reshape(batch, channels // 4, height * 2, width * 2)


def pack(latents: torch.Tensor) -> torch.Tensor:
    """``(B, C, h, w)`` to ``(B, h * w, C)`` tokens, row by row."""
    return latents.flatten(2).transpose(1, 2)


def grid_ids(height: int, width: int, time: int, device: torch.device) -> torch.Tensor:
    """The ``(h * w, 4)`` positions ``(time, row, column, 0)`` of an ``h x w`` token grid, row by row."""
    rows, columns = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    ids = torch.stack([torch.full_like(rows, time), rows, columns, torch.zeros_like(rows)], dim=-1)
    return ids.reshape(-1, 4).to(device)


def text_ids(length: int, device: torch.device) -> torch.Tensor:
    """The ``(length, 4)`` positions ``(0, 0, 0, l)`` of the prompt tokens."""
    ids = torch.zeros(length, 4, dtype=torch.long)
    ids[:, 3] = torch.arange(length)
    return ids.to(device)


def edit_image_list(edit_image: Image.Image | Sequence[Image.Image]) -> list[Image.Image]:
    """The reference images as a list, checked as diffusers checks them.

    Raises:
        ValueError: A path instead of an image, an empty list, an image with a side under 64 pixels, or an aspect
            ratio beyond 8:1.
    """
    images, _ = image_list(edit_image)
    for image in images:
        width, height = image.size
        if min(width, height) < EDIT_IMAGE_MIN_SIDE:
            raise ValueError(f"edit_image of {width}x{height} pixels is too small: FLUX.2 needs both sides of at least "
                             f"{EDIT_IMAGE_MIN_SIDE} pixels; upscale it")
        if max(width / height, height / width) > EDIT_IMAGE_MAX_ASPECT:
            raise ValueError(f"edit_image of {width}x{height} pixels is too elongated: FLUX.2 accepts aspect ratios "
                             f"up to {EDIT_IMAGE_MAX_ASPECT}:1; crop it")
    return images


def prepare_edit_image(image: Image.Image) -> Image.Image:
    """A reference image as diffusers feeds it to the VAE: shrunk (Lanczos) to at most 1024 x 1024 pixels keeping its
    aspect ratio, then centre-cropped to sides that are multiples of 16."""
    image = image.convert("RGB")
    width, height = image.size
    if width * height > EDIT_IMAGE_MAX_PIXELS:
        scale = math.sqrt(EDIT_IMAGE_MAX_PIXELS / (width * height))
        image = image.resize((int(width * scale), int(height * scale)), Image.Resampling.LANCZOS)
        width, height = image.size
    cropped_width, cropped_height = width // VAE_SCALE * VAE_SCALE, height // VAE_SCALE * VAE_SCALE
    left, top = (width - cropped_width) // 2, (height - cropped_height) // 2
    return image.crop((left, top, left + cropped_width, top + cropped_height))


class EditImageEmbedderUnit(PipelineUnit):
    """Encodes each reference image (``prepare_edit_image``) into normalised latents.

    Outputs ``edit_latents``, a list of ``(1, 128, h, w)`` tensors (sizes may differ), or ``None`` without images.
    """

    def __init__(self) -> None:
        super().__init__(input_params=("edit_image",), output_params=("edit_latents",), onload_model_names=("vae",))

    def process(self, pipe: Flux2KleinPipeline, edit_image: Image.Image | Sequence[Image.Image] | None) -> dict:
        if edit_image is None:
            return {"edit_latents": None}
        images = edit_image_list(edit_image)
        return {"edit_latents": [pipe.encode_image(prepare_edit_image(image)) for image in images]}


class Flux2KleinPipeline(TextToLatentPipeline):
    """FLUX.2 [klein] and [dev] generation and the computation its training shares.

    Build it with ``from_pretrained``; call it with a prompt to get an image. ``model_fn`` is also what training calls,
    on the state the units produce.
    """

    model_roles = MODEL_ROLES
    default_tokenizer_config = ModelConfig(model_id="black-forest-labs/FLUX.2-klein-4B",
                                           origin_file_pattern="tokenizer/")
    # The 4B scripts' list (single blocks 0-19), which fits both sizes; the 9B scripts also name blocks 20-23.
    default_lora_target_modules = ",".join([
        "to_q,to_k,to_v,to_out.0,add_q_proj,add_k_proj,add_v_proj,to_add_out,linear_in,linear_out,to_qkv_mlp_proj",
        *(f"single_transformer_blocks.{index}.attn.to_out" for index in range(20))])
    model_fn_params = ("prompt_emb", "embedded_guidance", "edit_latents")
    #: Extra inputs that must hold loaded images: the reference images of Edit training.
    image_inputs = ("edit_image",)
    #: Every prompt embedding is ``max_sequence_length`` tokens long (padding included), so batches need no padding.
    padded_inputs: dict[str, str] = {}
    scheduler_preset = "flux2"
    latent_channels = 128
    pixels_per_latent = VAE_SCALE
    #: The state holds patchified latents: one cell is one transformer token.
    latent_patch_size = 1
    input_types = {**TextToLatentPipeline.input_types, "embedded_guidance": real}
    #: As the reference trains: no CFG, ``embedded_guidance`` 1 (read by the dev transformer only; a column may set it).
    training_state = {**TextToLatentPipeline.training_state, "embedded_guidance": TRAINING_GUIDANCE}

    #: Step-distilled (klein-4B / 9B: few steps, no CFG) or base (CFG); see ``_after_load``.
    extra_attributes = {"is_distilled": False}
    unit_classes = image_units(EditImageEmbedderUnit, PromptEmbedderUnit)

    def _after_load(self, is_distilled: bool | None = None) -> None:
        """Decides whether the transformer is distilled.

        Args:
            is_distilled: Whether the transformer is step-distilled (no CFG). None: the ``is_distilled`` of the
                ``model_index.json`` beside its ``transformer/`` folder, else whether its repository id names a klein
                model that is not a base model (``FLUX.2-klein-4B`` yes, ``FLUX.2-klein-base-4B`` no).
        """
        self.is_distilled = is_distilled if is_distilled is not None else _is_distilled(self.model_configs.get("dit"))

    @classmethod
    def _companions(cls, roles: dict[str, ModelConfig], tokenizer_config: ModelConfig | None) -> dict[str, ModelConfig]:
        """As ``BasePipeline``'s, but a Mistral-3 text encoder given by path, without a tokenizer, gets FLUX.2 [dev]'s
        (``default_tokenizer_config`` is klein's Qwen3 tokenizer)."""
        text_encoder = roles.get("text_encoder")
        if tokenizer_config is None and text_encoder is not None and text_encoder.model_id is None \
                and model_class_name(text_encoder) == "Mistral3ForConditionalGeneration":
            tokenizer_config = DEV_TOKENIZER
        return super()._companions(roles, tokenizer_config)

    def latent_statistics(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The VAE's batch-norm ``running_mean`` and ``1 / sqrt(running_var + eps)`` over the 128 patchified
        channels, shaped to broadcast over ``like``."""
        bn = self.vae.bn
        shape = (1, -1) + (1,) * (like.dim() - 2)
        mean = bn.running_mean.view(shape).to(like.device, like.dtype)
        std = torch.sqrt(bn.running_var.view(shape) + self.vae.config.batch_norm_eps).to(like.device, like.dtype)
        return mean, 1.0 / std

    def set_inference_timesteps(self, num_inference_steps: int, denoising_strength: float = 1.0, *,
                                latent_shape: tuple[int, ...]) -> None:
        """FLUX.2's shift: the empirical ``mu`` of the token count ``h * w`` and the number of steps."""
        mu = flux2_empirical_mu(latent_shape[-2] * latent_shape[-1], num_inference_steps)
        self.scheduler.set_timesteps(num_inference_steps, denoising_strength, mu=mu)

    def model_fn(self, latents: torch.Tensor, timestep: torch.Tensor | float, prompt_emb: torch.Tensor,
                 embedded_guidance: float | None = None, edit_latents: Sequence[torch.Tensor] | None = None,
                 **_: Any) -> torch.Tensor:
        """The transformer's velocity prediction for ``(B, 128, h, w)`` latents at ``timestep`` (scale 0 to 1000).

        The reference images' tokens follow the latents' with their own positions; the prediction keeps only the
        latents' tokens. A guidance-distilled transformer (dev) gets ``embedded_guidance`` (default 4); klein's, which
        has no guidance embedding, ignores it. Extra state keys are accepted and ignored, since the loop passes the
        whole state.
        """
        batch, channels, height, width = latents.shape
        device = latents.device
        timestep = torch.as_tensor(timestep, device=device).to(latents.dtype).reshape(-1).expand(batch)
        tokens, ids = [pack(latents)], [grid_ids(height, width, 0, device)]
        for index, reference in enumerate(edit_latents or ()):
            tokens.append(pack(reference.to(latents.dtype)).expand(batch, -1, -1))
            time = EDIT_IMAGE_TIME_STEP * (index + 1)
            ids.append(grid_ids(reference.shape[-2], reference.shape[-1], time, device))
        guidance = None
        if self.dit.config.guidance_embeds:
            scale = DEFAULT_GUIDANCE if embedded_guidance is None else float(embedded_guidance)
            guidance = torch.full((batch,), scale, device=device, dtype=torch.float32)
        prediction = self.dit(hidden_states=torch.cat(tokens, dim=1), timestep=timestep / 1000, guidance=guidance,
                              encoder_hidden_states=prompt_emb.to(latents.dtype),
                              txt_ids=text_ids(prompt_emb.shape[1], device), img_ids=torch.cat(ids),
                              return_dict=False)[0]
        return prediction[:, :height * width].transpose(1, 2).reshape(batch, channels, height, width)

    def encode_image(self, image: Image.Image) -> torch.Tensor:
        """An RGB image (sides multiples of 16) as normalised patchified latents ``(1, 128, H/16, W/16)``, from the
        VAE's distribution mode as diffusers encodes reference images."""
        pixels = image_to_tensor(image).to(self.device, self.vae.dtype)
        latents = patchify(self.vae.encode(pixels).latent_dist.mode())
        mean, inverse_std = self.latent_statistics(latents)
        return ((latents - mean) * inverse_std).to(self.torch_dtype)

    def decode(self, inputs_shared: dict, inputs_posi: dict, inputs_nega: dict) -> torch.Tensor:
        """The final latents de-normalised, unpatchified and decoded by the VAE, as ``(B, 3, H, W)`` in ``[0, 1]``."""
        self.load_models_to_device(["vae"])
        latents = inputs_shared["latents"].to(self.vae.dtype)
        mean, inverse_std = self.latent_statistics(latents)
        images = self.vae.decode(unpatchify(latents / inverse_std + mean), return_dict=False)[0]
        return (images / 2 + 0.5).clamp(0, 1)

    def sample_input_problems(self, inputs: set[str]) -> list[str]:
        """FLUX.2 renders from a prompt and optional reference images (``edit_image``)."""
        return ['"input_image" is for Wan image-to-video; FLUX.2 takes reference images as "edit_image"'] \
            if "input_image" in inputs else []

    @torch.no_grad()
    def __call__(self, prompt: str, negative_prompt: str = "", cfg_scale: float | None = None,
                 embedded_guidance: float = DEFAULT_GUIDANCE, input_image: Image.Image | None = None,
                 denoising_strength: float = 1.0,
                 edit_image: Image.Image | Sequence[Image.Image] | None = None, height: int | None = None,
                 width: int | None = None, seed: int | None = None, rand_device: str = "cpu",
                 num_inference_steps: int | None = None, max_sequence_length: int = TOKENIZER_MAX_LENGTH,
                 output_type: str = "pil", progress_bar: bool = True) -> Image.Image | torch.Tensor:
        """Generates one image.

        Args:
            prompt: What to draw, or (with ``edit_image``) how to use the reference images.
            negative_prompt: What to steer away from with CFG (diffusers always uses "").
            cfg_scale: Classifier-free guidance scale, used by klein base models and dev when above 1; a distilled
                klein model ignores it (with a warning above 1). Unset: 4 for a klein base model, else 1.
            embedded_guidance: The guidance scale the dev transformer takes as an input (diffusers'
                ``guidance_scale``); ignored by klein's transformers, which have no guidance embedding.
            input_image: Start from this image instead of pure noise (image-to-image).
            denoising_strength: With ``input_image``: how much of the schedule to run.
            edit_image: One reference image or a list of them (diffusers' ``image``).
            height: Output height in pixels, rounded to a multiple of 16. Unset: the first reference image's
                (prepared) height, else 1024.
            width: Output width in pixels; unset as ``height``.
            seed: Noise seed; ``None`` draws from torch's global generator.
            rand_device: Device the noise is drawn on (CPU noise is the same on every machine).
            num_inference_steps: Denoising steps. Unset: 4 for a distilled klein model, else 50.
            max_sequence_length: Prompt tokens, template included (at most 512); the prompt is padded to it.
            output_type: ``"pil"`` for a PIL image, ``"pt"`` for a ``(1, 3, H, W)`` tensor in ``[0, 1]``.
            progress_bar: Show a progress bar over the steps.
        """
        check_call_inputs(prompt, output_type, max_sequence_length, TOKENIZER_MAX_LENGTH)
        cfg_scale = self._effective_cfg_scale(cfg_scale)
        num_inference_steps = num_inference_steps or (4 if self.is_distilled else 50)
        if edit_image is not None and (height is None or width is None):
            first = prepare_edit_image(edit_image_list(edit_image)[0])
            height, width = height or first.height, width or first.width
        height, width = height or DEFAULT_SIZE, width or DEFAULT_SIZE
        multiple = self.size_multiple()
        latent_shape = (1, self.latent_channels, max(multiple, height // multiple * multiple) // VAE_SCALE,
                        max(multiple, width // multiple * multiple) // VAE_SCALE)
        inputs_shared = {
            "cfg_scale": cfg_scale, "embedded_guidance": embedded_guidance, "input_image": input_image,
            "denoising_strength": denoising_strength, "edit_image": edit_image,
            "height": latent_shape[2] * VAE_SCALE, "width": latent_shape[3] * VAE_SCALE,
            "seed": seed, "rand_device": rand_device, "max_sequence_length": max_sequence_length,
        }  # fmt: skip
        if (inputs_shared["height"], inputs_shared["width"]) != (height, width):
            logger.warning("height=%d, width=%d are not multiples of %d; using %d x %d", height, width, multiple,
                           inputs_shared["height"], inputs_shared["width"])
        self.set_inference_timesteps(num_inference_steps, denoising_strength, latent_shape=latent_shape)
        images = self.denoise(inputs_shared, {"prompt": prompt}, {"negative_prompt": negative_prompt},
                              progress_bar=progress_bar)
        return self.image_output(images, output_type)

    def _effective_cfg_scale(self, cfg_scale: float | None) -> float:
        """The scale the loop uses: 1 (no CFG) for a distilled model or a scale of at most 1, as diffusers does; unset,
        1 for dev too, whose guidance is embedded."""
        if cfg_scale is None:
            guidance_distilled = self.dit is not None and self.dit.config.guidance_embeds
            return 1.0 if self.is_distilled or guidance_distilled else 4.0
        if self.is_distilled:
            if cfg_scale > 1:
                logger.warning("cfg_scale=%g is ignored: this FLUX.2 [klein] transformer is step-distilled (no CFG); "
                               "load a klein-base model for CFG", cfg_scale)
            return 1.0
        return float(cfg_scale) if cfg_scale > 1 else 1.0


def _is_distilled(dit_config: ModelConfig | None) -> bool:
    """Whether the transformer ``dit_config`` names is step-distilled: the ``is_distilled`` of the ``model_index.json``
    beside its folder when there is one, else whether its repository id names a non-base klein model."""
    if dit_config is None:
        return False
    try:
        files = resolve_files(dit_config)
    except (FileNotFoundError, OSError):
        files = []
    for path in files[:1]:
        index = (path if path.is_dir() else path.parent).parent / "model_index.json"
        if index.is_file():
            return bool(json.loads(index.read_text()).get("is_distilled", False))
    model_id = (dit_config.model_id or "").lower()
    return "klein" in model_id and "base" not in model_id
