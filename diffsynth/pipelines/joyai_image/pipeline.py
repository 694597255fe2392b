"""JoyAI-Image-Edit image editing (and text-to-image) as declared units over the diffusers / transformers models.

Models, by pipeline name: ``dit`` (``JoyImageEditTransformer3DModel``), ``vae`` (``AutoencoderKLWan``, the Wan2.1
VAE), ``text_encoder`` (``Qwen3VLForConditionalGeneration``, the release's ``JoyAI-Image-Und``), ``tokenizer`` and
``processor`` (the Qwen3-VL processor of ``JoyAI-Image-Und/``, for edit images). The computation follows diffusers'
``JoyImageEditPipeline`` step for step:

- the prompt is wrapped in JoyAI's template (with the edit image's vision tokens when there is one) and the
  pre-norm output of the encoder's last decoder layer, without the template's first 34 tokens, is the caption;
- the edit image, resized to cover the output size and center-cropped, is VAE-encoded and normalised with the VAE's
  latent statistics; it joins the noisy latents as a second item ``(B, 2, 16, 1, h, w)``, the target last, and is
  never denoised;
- CFG rescales the guided prediction to the norm of the conditional one over the channels, as diffusers does.

The sampling schedule is the reference's: flow-match Euler on ``linspace(1, 0, N + 1)[:-1]`` with shift 4.
State latents are ``(B, 16, h, w)`` like every image family's; ``model_fn`` adds the item and frame axes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from PIL import Image

from ...core.loader import ModelConfig
from ...diffusion.base_pipeline import PipelineUnit
from ..common import (
    ImageNoiseUnit,
    InputImageEmbedderUnit,
    LatentsUnit,
    PromptUnit,
    ShapeCheckUnit,
    TextToLatentPipeline,
    check_call_inputs,
    image_list,
    load_if_on_disk,
    sibling_folder,
)
from ..qwen_image.edit import load_processor
from ..qwen_image.pipeline import QwenImagePipeline

__all__ = ["JoyAIImagePipeline", "ModelConfig"]

DEFAULT_SIZE = 1024
DEFAULT_SHIFT = 4.0
SYSTEM_PROMPT = ("<|im_start|>system\n \\nDescribe the image by detailing the color, shape, size, texture, quantity, "
                 "text, spatial relationships of the objects and background:<|im_end|>\n")
TEXT_TEMPLATE = SYSTEM_PROMPT + "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
EDIT_TEMPLATE = (SYSTEM_PROMPT + "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{}<|im_end|>\n"
                 "<|im_start|>assistant\n")
# The system prompt's tokens, dropped from the caption.
TEMPLATE_DROP_TOKENS = 34
# diffusers' (and the reference's) default cap on the caption's tokens.
MAX_SEQUENCE_LENGTH = 4096
# diffusers caps a text-only prompt at this many tokens after the template.
TEXT_TOKEN_LIMIT = 2048
RELEASE_ID = "jd-opensource/JoyAI-Image-Edit"
DEFAULT_PROCESSOR_CONFIG = ModelConfig(model_id=RELEASE_ID, origin_file_pattern="JoyAI-Image-Und/")

MODEL_ROLES = {
    "JoyImageEditTransformer3DModel": "dit",
    "AutoencoderKLWan": "vae",
    "Qwen3VLForConditionalGeneration": "text_encoder",
}


def fit_edit_image(image: Image.Image, height: int, width: int) -> Image.Image:
    """``image`` in RGB scaled (bilinear) to cover ``width x height`` and center-cropped to it, as diffusers'
    ``JoyImageEditImageProcessor.resize_center_crop``."""
    image = image.convert("RGB")
    scale = max(height / image.height, width / image.width)
    size = math.ceil(image.width * scale), math.ceil(image.height * scale)
    image = image.resize(size, Image.Resampling.BILINEAR)
    left, top = (size[0] - width) // 2, (size[1] - height) // 2
    return image.crop((left, top, left + width, top + height))


def last_layer_states(encoder: torch.nn.Module, **inputs: Any) -> torch.Tensor:
    """The pre-norm output of ``encoder``'s last decoder layer: what the release was trained on (transformers 4.57's
    ``hidden_states[-1]``; transformers 5 returns the normed states there instead)."""
    captured = {}

    def keep(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
        captured["states"] = output[0] if isinstance(output, tuple) else output

    handle = encoder.model.language_model.layers[-1].register_forward_hook(keep)
    try:
        encoder(**inputs)
    finally:
        handle.remove()
    return captured["states"]


class EditImageEmbedderUnit(PipelineUnit):
    """Encodes the edit image, fitted to the output size, into normalised reference latents ``edit_latents``
    ``(1, 16, h, w)`` (None without one), from the VAE's distribution mode (diffusers samples it; the mode keeps a
    cached latent equal to a single-stage run's)."""

    def __init__(self) -> None:
        super().__init__(input_params=("edit_image", "height", "width"), output_params=("edit_latents",),
                         onload_model_names=("vae",))

    def process(self, pipe: JoyAIImagePipeline, edit_image: Any, height: int, width: int) -> dict:
        if edit_image is None:
            return {"edit_latents": None}
        return {"edit_latents": pipe.encode_image(fit_edit_image(single_edit_image(edit_image), height, width))}


def single_edit_image(edit_image: Image.Image | Sequence[Image.Image]) -> Image.Image:
    """The one edit image of ``edit_image`` (an image or a one-image list).

    Raises:
        ValueError: Several images: JoyAI-Image-Edit edits one.
    """
    images, _ = image_list(edit_image, "edit_image")
    if len(images) != 1:
        raise ValueError(f"edit_image holds {len(images)} images; JoyAI-Image-Edit edits one: pass edit_image=image")
    return images[0]


class PromptEmbedderUnit(PromptUnit):
    """Encodes the prompt (and, with CFG, the negative prompt) as diffusers does: with the edit image through the
    Qwen3-VL processor when there is one, else the text alone. Outputs ``prompt_emb`` ``(1, tokens, hidden)``."""

    shared_inputs = ("edit_image", "height", "width", "max_sequence_length")
    text_encoder_entry = f"{RELEASE_ID}:JoyAI-Image-Und/model*.safetensors"

    def process(self, pipe: JoyAIImagePipeline, prompt: str | None, edit_image: Any, height: int, width: int,
                max_sequence_length: int | None) -> dict:
        self.require_text_encoder(pipe)
        limit = max_sequence_length or MAX_SEQUENCE_LENGTH
        if edit_image is None:
            tokens = pipe.tokenizer([TEXT_TEMPLATE.format(prompt or "")], truncation=True, return_tensors="pt",
                                    max_length=TEXT_TOKEN_LIMIT + TEMPLATE_DROP_TOKENS).to(pipe.device)
            states = last_layer_states(pipe.text_encoder, **tokens)[:, TEMPLATE_DROP_TOKENS:][:, :limit]
        else:
            image = fit_edit_image(single_edit_image(edit_image), height, width)
            inputs = pipe.edit_processor()(text=[EDIT_TEMPLATE.format(prompt or "")], images=[image], padding=True,
                                           return_tensors="pt").to(pipe.device)
            # An edit prompt keeps its last tokens, as diffusers cuts it.
            states = last_layer_states(pipe.text_encoder, **inputs)[:, TEMPLATE_DROP_TOKENS:][:, -limit:]
        return {"prompt_emb": states.to(pipe.torch_dtype)}


class JoyAIImagePipeline(TextToLatentPipeline):
    """JoyAI-Image-Edit editing and text-to-image generation, and the computation its training shares.

    Build it with ``from_pretrained`` (``processor_config=`` names the Qwen3-VL processor folder, by default the
    ``JoyAI-Image-Und/`` folder of the release); call it with a prompt and ``edit_image`` to edit an image.
    """

    model_roles = MODEL_ROLES
    default_tokenizer_config = DEFAULT_PROCESSOR_CONFIG
    default_lora_target_modules = "img_attn_qkv,txt_attn_qkv,img_attn_proj,txt_attn_proj"
    model_fn_params = ("prompt_emb", "edit_latents")
    scheduler_preset = "joyai_image"
    load_options = ("processor_config",)
    extra_attributes = {"processor": None, "processor_config": None}
    image_inputs = ("edit_image",)
    training_state = {**TextToLatentPipeline.training_state, "max_sequence_length": MAX_SEQUENCE_LENGTH}
    unit_classes = (ShapeCheckUnit, ImageNoiseUnit, InputImageEmbedderUnit, EditImageEmbedderUnit, LatentsUnit,
                    PromptEmbedderUnit)
    # The Wan2.1 VAE, one frame, normalised by its latent statistics: as Qwen-Image's VAE.
    encode_image = QwenImagePipeline.encode_image

    def decode(self, inputs_shared: dict, inputs_posi: dict, inputs_nega: dict) -> torch.Tensor:
        """The final latents through the VAE, as ``(B, 3, H, W)`` values in ``[0, 1]``; the latents themselves when
        ``output_type`` is ``"latent"``."""
        if inputs_shared.get("output_type") == "latent":
            return inputs_shared["latents"]
        return QwenImagePipeline.decode(self, inputs_shared, inputs_posi, inputs_nega)

    def _after_load(self, processor_config: ModelConfig | None = None) -> None:
        """Finds the Qwen3-VL processor: ``processor_config`` (``--processor_path``) when given, loaded now; else
        the text encoder's folder, loaded when on disk (else on first use).

        Raises:
            ModelLoadError: The processor folder holds no readable processor.
        """
        if processor_config is not None:
            self.processor_config, self.processor = processor_config, load_processor(processor_config)
            return
        encoder = self.model_configs.get("text_encoder")
        self.processor_config = (sibling_folder(encoder, "JoyAI-Image-Und") if encoder is not None else None) \
            or DEFAULT_PROCESSOR_CONFIG
        self.processor = load_if_on_disk(self.processor_config, load_processor)

    def edit_processor(self) -> Any:
        """The Qwen3-VL processor, loaded (downloaded if need be) on first use."""
        if self.processor is None:
            self.processor = load_processor(self.processor_config or DEFAULT_PROCESSOR_CONFIG)
        return self.processor

    def model_fn(self, latents: torch.Tensor, timestep: torch.Tensor | float, prompt_emb: torch.Tensor,
                 edit_latents: torch.Tensor | None = None, **_: Any) -> torch.Tensor:
        """The velocity for ``(B, 16, h, w)`` ``latents`` at ``timestep`` (scale 0 to 1000), the edit image's
        latents (if any) read beside them as the first item. Extra state keys are ignored."""
        batch = latents.shape[0]
        items = latents[:, None, :, None]
        if edit_latents is not None:
            reference = edit_latents.to(latents.dtype)[:, None, :, None].expand(batch, -1, -1, -1, -1, -1)
            items = torch.cat([reference, items], dim=1)
        timestep = torch.as_tensor(timestep, device=latents.device).to(latents.dtype).reshape(-1).expand(batch)
        output = self.dit(hidden_states=items, timestep=timestep,
                          encoder_hidden_states=prompt_emb.to(latents.dtype).expand(batch, -1, -1),
                          return_dict=False)[0]
        return output[:, -1, :, 0]

    def guide(self, positive: torch.Tensor, negative: torch.Tensor, cfg_scale: float) -> torch.Tensor:
        """CFG rescaled to the conditional prediction's norm over the channels, at every position."""
        guided = negative + cfg_scale * (positive - negative)
        ratio = positive.norm(dim=1, keepdim=True) / guided.norm(dim=1, keepdim=True).clamp_min(1e-6)
        return guided * ratio

    def sample_input_problems(self, inputs: set[str]) -> list[str]:
        """JoyAI-Image-Edit renders from a prompt and ``edit_image``."""
        return ['"input_image" is for Wan image-to-video; JoyAI-Image-Edit takes "edit_image"'] \
            if "input_image" in inputs else []

    @torch.no_grad()
    def __call__(self, prompt: str, negative_prompt: str = "", cfg_scale: float = 5.0,
                 edit_image: Image.Image | Sequence[Image.Image] | None = None, input_image: Image.Image | None = None,
                 denoising_strength: float = 1.0, height: int | None = None, width: int | None = None,
                 seed: int | None = None, rand_device: str = "cpu", max_sequence_length: int = MAX_SEQUENCE_LENGTH,
                 num_inference_steps: int = 30, shift: float = DEFAULT_SHIFT, output_type: str = "pil",
                 progress_bar: bool = True) -> Image.Image | torch.Tensor:
        """Edits one image (or, without ``edit_image``, generates one).

        Args:
            prompt: The edit instruction (or what to draw).
            negative_prompt: What to steer away from; used when ``cfg_scale`` is not 1.
            cfg_scale: CFG scale, rescaled to the conditional prediction's norm (diffusers' ``guidance_scale``);
                1 turns CFG off.
            edit_image: The image to edit (or a one-image list).
            input_image: Start from this image instead of pure noise (image-to-image).
            denoising_strength: With ``input_image``: how much of the schedule to run (1 ignores the image).
            height: Output height in pixels, rounded to a multiple of 16; default 1024.
            width: Output width in pixels, rounded to a multiple of 16; default 1024.
            seed: Noise seed; ``None`` draws from torch's global generator.
            rand_device: Device the noise is drawn on (CPU noise is the same on every machine).
            max_sequence_length: The most caption tokens kept.
            num_inference_steps: Denoising steps (the reference's example: 30).
            shift: The schedule's static shift (4, the reference's).
            output_type: ``"pil"`` for a PIL image, ``"pt"`` for a ``(1, 3, H, W)`` tensor in ``[0, 1]``, ``"latent"``
                for the final normalised ``(1, 16, H / 8, W / 8)`` latents (not decoded, as diffusers' ``"latent"``).
            progress_bar: Show a progress bar over the steps.
        """
        check_call_inputs(prompt, output_type, max_sequence_length, MAX_SEQUENCE_LENGTH,
                          output_types=("pil", "pt", "latent"))
        if shift <= 0:
            raise ValueError(f"shift={shift} must be positive; use 4.0, the reference's")
        height, width = height or DEFAULT_SIZE, width or DEFAULT_SIZE
        self.scheduler.shift = float(shift)
        self.set_inference_timesteps(num_inference_steps, denoising_strength,
                                     latent_shape=self.image_latent_shape(height, width))
        inputs_shared = {
            "cfg_scale": cfg_scale, "input_image": input_image, "edit_image": edit_image,
            "denoising_strength": denoising_strength, "height": height, "width": width, "seed": seed,
            "rand_device": rand_device, "max_sequence_length": max_sequence_length, "output_type": output_type,
        }  # fmt: skip
        images = self.denoise(inputs_shared, {"prompt": prompt}, {"negative_prompt": negative_prompt},
                              progress_bar=progress_bar)
        return self.image_output(images, output_type)
