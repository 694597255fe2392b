"""FLUX.1 [dev], FLUX.1-Krea-dev and FLUX.1-Kontext-dev text-to-image and Kontext editing as declared units over the
diffusers / transformers models.

Models, by pipeline name: ``dit`` (``FluxTransformer2DModel``), ``vae`` (``AutoencoderKL``, 16 latent channels),
``text_encoder`` (``CLIPTextModel``), ``text_encoder_2`` (``T5EncoderModel``), ``tokenizer`` (CLIP) and
``tokenizer_2`` (T5). The released single files (``flux1-dev.safetensors``, ``ae.safetensors``) load into the same
classes (``original.py``). The computation follows diffusers' ``FluxPipeline`` and
``FluxKontextPipeline`` step for step:

- the prompt goes through CLIP (77 tokens, padded; its pooled output conditions the modulation) and T5 (padded to
  ``max_sequence_length``, 512; its hidden states are the text tokens), neither with an attention mask;
- latents are normalised with the VAE's ``shift_factor`` and ``scaling_factor`` and packed 2x2 into 64-channel tokens
  in ``model_fn``; the state keeps them unpacked, ``(batch, 16, height / 8, width / 8)``;
- token positions are ``(0, row, column)`` for the image, zeros for the text, ``(1, row, column)`` for Kontext's
  reference images (appended after the image's tokens; their predictions are dropped);
- the guidance-distilled transformers take the guidance scale as an input (``embedded_guidance``, diffusers'
  ``guidance_scale``, 3.5 by default); true CFG with a negative prompt runs when ``cfg_scale`` is above 1
  (diffusers' ``true_cfg_scale``);
- the schedule is ``linspace(1, 1/N, N)`` bent by the exponential shift whose ``mu`` grows with the token count, on
  the line of the released ``scheduler_config.json``.

Training follows the reference trainer: ``embedded_guidance`` 1, no CFG, timesteps from the 1000-step grid under
the static shift 3, and Kontext's reference images (``kontext_images``) at the size the dataset gives them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from PIL import Image

from ...core.data.cells import real
from ...core.loader import ModelConfig
from ...diffusion.base_pipeline import PipelineUnit
from ..common import (
    SIZE_MULTIPLE,
    PromptUnit,
    ScaledLatentPipeline,
    SecondTokenizerPipeline,
    TextToLatentPipeline,
    check_call_inputs,
    image_list,
    image_units,
    pack_latents,
    unpack_latents,
)

__all__ = ["FluxPipeline", "kontext_size"]

logger = logging.getLogger(__name__)

DEFAULT_SIZE = 1024
T5_MAX_LENGTH = 512
DEFAULT_GUIDANCE = 3.5
TRAINING_GUIDANCE = 1.0
# Kontext was trained at these sizes (width, height); diffusers fits a reference image to the one of the nearest
# aspect ratio before encoding it.
KONTEXT_RESOLUTIONS = (
    (672, 1568), (688, 1504), (720, 1456), (752, 1392), (800, 1328), (832, 1248), (880, 1184), (944, 1104),
    (1024, 1024), (1104, 944), (1184, 880), (1248, 832), (1328, 800), (1392, 752), (1456, 720), (1504, 688),
    (1568, 672),
)

MODEL_ROLES = {
    "FluxTransformer2DModel": "dit",
    "AutoencoderKL": "vae",
    "CLIPTextModel": "text_encoder",
    "T5EncoderModel": "text_encoder_2",
}

# The reference trainer's module names (DiffSynth-Studio's FluxDiT) -> the diffusers modules each covers, as
# patterns of whole module names: its fused projections (a_to_qkv, to_qkv_mlp) are several modules here, and its
# block-local names (proj_out, norm.linear) must not also select the diffusers model's top-level layers.
_DOUBLE = r"transformer_blocks\.\d+\."
_SINGLE = r"single_transformer_blocks\.\d+\."
REFERENCE_TARGETS: dict[str, tuple[str, ...]] = {
    "a_to_qkv": (_DOUBLE + r"attn\.to_[qkv]",),
    "b_to_qkv": (_DOUBLE + r"attn\.add_[qkv]_proj",),
    "a_to_out": (_DOUBLE + r"attn\.to_out\.0",),
    "b_to_out": (_DOUBLE + r"attn\.to_add_out",),
    "norm1_a.linear": (_DOUBLE + r"norm1\.linear",),
    "norm1_b.linear": (_DOUBLE + r"norm1_context\.linear",),
    "ff_a.0": (_DOUBLE + r"ff\.net\.0\.proj",),
    "ff_a.2": (_DOUBLE + r"ff\.net\.2",),
    "ff_b.0": (_DOUBLE + r"ff_context\.net\.0\.proj",),
    "ff_b.2": (_DOUBLE + r"ff_context\.net\.2",),
    "to_qkv_mlp": (_SINGLE + r"(attn\.to_[qkv]|proj_mlp)",),
    "proj_out": (_SINGLE + r"proj_out",),
    "norm.linear": (_SINGLE + r"norm\.linear",),
    "final_proj_out": (r"proj_out",),
    "final_norm_out.linear": (r"norm_out\.linear",),
}


def kontext_size(image: Image.Image, auto_resize: bool) -> tuple[int, int]:
    """``(width, height)`` a Kontext reference image is encoded at: with ``auto_resize``, the trained resolution of
    the nearest aspect ratio (diffusers' default), else its own size; either cut down to multiples of 16."""
    width, height = image.size
    if auto_resize:
        aspect = width / height
        _, width, height = min((abs(aspect - w / h), w, h) for w, h in KONTEXT_RESOLUTIONS)
    return width // SIZE_MULTIPLE * SIZE_MULTIPLE, height // SIZE_MULTIPLE * SIZE_MULTIPLE


def grid_ids(height: int, width: int, first: int, device: torch.device) -> torch.Tensor:
    """The ``(height * width, 3)`` positions ``(first, row, column)`` of a token grid, row by row."""
    rows, columns = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    ids = torch.stack([torch.full_like(rows, first), rows, columns], dim=-1).reshape(-1, 3)
    return ids.to(device=device, dtype=torch.float32)


class KontextImageEmbedderUnit(PipelineUnit):
    """Encodes each Kontext reference image (``kontext_images``, one or a list) into normalised latents.

    Outputs ``kontext_latents``, a list of ``(1, 16, h, w)`` tensors, or ``None`` without images. Each image is
    resized (Lanczos) to ``kontext_size``: a trained resolution when ``kontext_auto_resize`` is set (inference, as
    diffusers), else its own size cut to multiples of 16 (training, as the reference).
    """

    def __init__(self) -> None:
        super().__init__(input_params=("kontext_images", "kontext_auto_resize"), output_params=("kontext_latents",),
                         onload_model_names=("vae",))

    def process(self, pipe: FluxPipeline, kontext_images: Image.Image | Sequence[Image.Image] | None,
                kontext_auto_resize: bool | None) -> dict:
        if kontext_images is None:
            return {"kontext_latents": None}
        latents = []
        for image in image_list(kontext_images, "kontext_images")[0]:
            size = kontext_size(image, bool(kontext_auto_resize))
            image = image.convert("RGB")
            if image.size != size:
                image = image.resize(size, Image.Resampling.LANCZOS)
            latents.append(pipe.encode_image(image))
        return {"kontext_latents": latents}


class PromptEmbedderUnit(PromptUnit):
    """Encodes the prompt (and, with CFG, the negative prompt) with CLIP and T5.

    Outputs ``prompt_emb`` ``(1, max_sequence_length, T5 width)``, T5's hidden states of the padded prompt, and
    ``pooled_prompt_emb`` ``(1, CLIP width)``, CLIP's pooled output of the prompt padded to 77 tokens.
    """

    outputs = ("prompt_emb", "pooled_prompt_emb")
    encoders = ("text_encoder", "text_encoder_2")

    def process(self, pipe: FluxPipeline, prompt: str | None, max_sequence_length: int | None) -> dict:
        missing = [name for name in ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2")
                   if getattr(pipe, name) is None]
        if missing:
            raise ValueError(f"encoding a prompt needs CLIP and T5 with their tokenizers; {missing} are not loaded: "
                             "add 'black-forest-labs/FLUX.1-dev:text_encoder/model.safetensors' and "
                             "'black-forest-labs/FLUX.1-dev:text_encoder_2/*.safetensors' to the model configs")
        prompt = prompt or ""
        clip_tokens = pipe.tokenizer(prompt, padding="max_length", max_length=pipe.tokenizer.model_max_length,
                                     truncation=True, return_tensors="pt").input_ids.to(pipe.device)
        pooled = pipe.text_encoder(clip_tokens, output_hidden_states=False).pooler_output
        t5_tokens = pipe.tokenizer_2(prompt, padding="max_length", max_length=max_sequence_length or T5_MAX_LENGTH,
                                     truncation=True, return_tensors="pt").input_ids.to(pipe.device)
        hidden = pipe.text_encoder_2(t5_tokens, output_hidden_states=False)[0]
        return {"prompt_emb": hidden.to(pipe.torch_dtype), "pooled_prompt_emb": pooled.to(pipe.torch_dtype)}


class FluxPipeline(SecondTokenizerPipeline, ScaledLatentPipeline):
    """FLUX.1 [dev] / Krea / Kontext generation and the computation its training shares.

    Build it with ``from_pretrained``; call it with a prompt (and, for Kontext, ``kontext_images``) to get an image.
    ``model_fn`` is also what training calls, on the state the units produce.
    """

    model_roles = MODEL_ROLES
    default_tokenizer_config = ModelConfig(model_id="black-forest-labs/FLUX.1-dev", origin_file_pattern="tokenizer/")
    default_tokenizer_2_config = ModelConfig(model_id="black-forest-labs/FLUX.1-dev",
                                             origin_file_pattern="tokenizer_2/")
    lora_target_aliases = REFERENCE_TARGETS
    default_lora_target_modules = ("a_to_qkv,b_to_qkv,ff_a.0,ff_a.2,ff_b.0,ff_b.2,a_to_out,b_to_out,proj_out,norm.linear,"
                                   "norm1_a.linear,norm1_b.linear,to_qkv_mlp")
    model_fn_params = ("prompt_emb", "pooled_prompt_emb", "embedded_guidance", "kontext_latents")
    #: Kontext's reference images.
    image_inputs = ("kontext_images",)
    #: Every prompt embedding is ``max_sequence_length`` tokens long (padding included), so batches need no padding.
    padded_inputs: dict[str, str] = {}
    scheduler_preset = "flux"
    input_types = {**TextToLatentPipeline.input_types, "embedded_guidance": real}
    #: As the reference trains: no CFG, ``embedded_guidance`` 1 (a column may set it), Kontext images at their own
    #: size.
    training_state = {**TextToLatentPipeline.training_state, "embedded_guidance": TRAINING_GUIDANCE,
                      "kontext_auto_resize": False}
    unit_classes = image_units(KontextImageEmbedderUnit, PromptEmbedderUnit)

    def set_inference_timesteps(self, num_inference_steps: int, denoising_strength: float = 1.0, *,
                                latent_shape: tuple[int, ...]) -> None:
        """FLUX.1's shift grows with the token count, ``(latent height / 2) * (latent width / 2)``."""
        image_seq_len = (latent_shape[-2] // 2) * (latent_shape[-1] // 2)
        self.scheduler.set_timesteps(num_inference_steps, denoising_strength, image_seq_len=image_seq_len)

    def model_fn(self, latents: torch.Tensor, timestep: torch.Tensor | float, prompt_emb: torch.Tensor,
                 pooled_prompt_emb: torch.Tensor, embedded_guidance: float | None = None,
                 kontext_latents: Sequence[torch.Tensor] | None = None, **_: Any) -> torch.Tensor:
        """The transformer's velocity prediction for unpacked ``(B, 16, h, w)`` latents at ``timestep`` (0 to 1000).

        Kontext's reference latents follow the latents' tokens with their own positions; the prediction keeps only
        the latents' tokens. A guidance-distilled transformer gets ``embedded_guidance`` (default 3.5); one without
        a guidance embedding ignores it. Extra state keys are accepted and ignored, since the loop passes the whole
        state.
        """
        batch, _, height, width = latents.shape
        device = latents.device
        timestep = torch.as_tensor(timestep, device=device).to(latents.dtype).reshape(-1).expand(batch)
        tokens, ids = [pack_latents(latents)], [grid_ids(height // 2, width // 2, 0, device)]
        for reference in kontext_latents or ():
            tokens.append(pack_latents(reference.to(latents.dtype)).expand(batch, -1, -1))
            ids.append(grid_ids(reference.shape[-2] // 2, reference.shape[-1] // 2, 1, device))
        guidance = None
        if self.dit.config.guidance_embeds:
            scale = DEFAULT_GUIDANCE if embedded_guidance is None else float(embedded_guidance)
            guidance = torch.full((batch,), scale, device=device, dtype=torch.float32)
        prompt_emb = prompt_emb.to(latents.dtype)
        prediction = self.dit(hidden_states=torch.cat(tokens, dim=1), timestep=timestep / 1000, guidance=guidance,
                              pooled_projections=pooled_prompt_emb.to(latents.dtype), encoder_hidden_states=prompt_emb,
                              txt_ids=torch.zeros(prompt_emb.shape[1], 3, device=device), img_ids=torch.cat(ids),
                              return_dict=False)[0]
        return unpack_latents(prediction[:, :tokens[0].shape[1]], height, width)

    def sample_input_problems(self, inputs: set[str]) -> list[str]:
        """FLUX.1 renders from a prompt and, for Kontext, reference images (``kontext_images``)."""
        problems = []
        if "input_image" in inputs:
            problems.append('"input_image" is for Wan image-to-video; FLUX.1 Kontext takes reference images as '
                            '"kontext_images"')
        if "edit_image" in inputs:
            problems.append('FLUX.1 Kontext takes its reference images as "kontext_images", not "edit_image"')
        return problems

    @torch.no_grad()
    def __call__(self, prompt: str, negative_prompt: str = "", cfg_scale: float = 1.0,
                 embedded_guidance: float = DEFAULT_GUIDANCE, input_image: Image.Image | None = None,
                 denoising_strength: float = 1.0, kontext_images: Image.Image | Sequence[Image.Image] | None = None,
                 kontext_auto_resize: bool = True, height: int | None = None, width: int | None = None,
                 seed: int | None = None, rand_device: str = "cpu", num_inference_steps: int = 30,
                 max_sequence_length: int = T5_MAX_LENGTH, output_type: str = "pil",
                 progress_bar: bool = True) -> Image.Image | torch.Tensor:
        """Generates one image.

        Args:
            prompt: What to draw, or (Kontext, with ``kontext_images``) how to change the reference image.
            negative_prompt: What to steer away from; used when ``cfg_scale`` is above 1.
            cfg_scale: True classifier-free guidance (diffusers' ``true_cfg_scale``); 1 turns it off and halves the
                work per step. The distilled models are usually run without it, guided by ``embedded_guidance``.
            embedded_guidance: The guidance scale the distilled transformer takes as an input (diffusers'
                ``guidance_scale``); ignored by a transformer without a guidance embedding.
            input_image: Start from this image instead of pure noise (image-to-image).
            denoising_strength: With ``input_image``: how much of the schedule to run (1 ignores the image).
            kontext_images: Kontext's reference image (diffusers' ``image``), or a list of them.
            kontext_auto_resize: Fit each reference image to Kontext's trained resolution of the nearest aspect ratio
                first, as diffusers does (its ``_auto_resize``); else encode it at its own size (multiples of 16).
            height: Output height in pixels, rounded to a multiple of 16 (default 1024).
            width: Output width in pixels, rounded to a multiple of 16 (default 1024).
            seed: Noise seed; ``None`` draws from torch's global generator.
            rand_device: Device the noise is drawn on (CPU noise is the same on every machine).
            num_inference_steps: Denoising steps.
            max_sequence_length: T5 tokens the prompt is padded or cut to (at most 512).
            output_type: ``"pil"`` for a PIL image, ``"pt"`` for a ``(1, 3, H, W)`` tensor in ``[0, 1]``.
            progress_bar: Show a progress bar over the steps.
        """
        check_call_inputs(prompt, output_type, max_sequence_length, T5_MAX_LENGTH)
        height, width = height or DEFAULT_SIZE, width or DEFAULT_SIZE
        self.set_inference_timesteps(num_inference_steps, denoising_strength,
                                     latent_shape=self.image_latent_shape(height, width))
        inputs_shared = {
            "cfg_scale": cfg_scale, "embedded_guidance": embedded_guidance, "input_image": input_image,
            "denoising_strength": denoising_strength, "kontext_images": kontext_images,
            "kontext_auto_resize": kontext_auto_resize, "height": height, "width": width, "seed": seed,
            "rand_device": rand_device, "max_sequence_length": max_sequence_length,
        }  # fmt: skip
        images = self.denoise(inputs_shared, {"prompt": prompt}, {"negative_prompt": negative_prompt},
                              progress_bar=progress_bar)
        return self.image_output(images, output_type)
