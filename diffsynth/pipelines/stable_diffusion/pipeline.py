"""Stable Diffusion 1.x text-to-image as declared units over the diffusers / transformers models.

Models, by pipeline name (the reference's): ``unet`` (``UNet2DConditionModel``), ``vae`` (``AutoencoderKL``, 4 latent
channels), ``text_encoder`` (``CLIPTextModel``) and ``tokenizer``. The computation follows diffusers'
``StableDiffusionPipeline`` with a ``DDIMScheduler`` step for step: the prompt is padded to CLIP's 77 tokens and the
encoder's last hidden state is the UNet's cross-attention context; latents are the VAE's scaled by its
``scaling_factor``; sampling is DDIM with eta 0 on the schedule of the release's ``scheduler/scheduler_config.json``
(SD 1.5's values when that file is not on disk); ``cfg_scale`` is diffusers' ``guidance_scale``.

Training learns the noise, or the velocity where the scheduler config says ``prediction_type: v_prediction``, on the
1000 discrete DDPM steps (``diffusion.ddpm.DDPMSchedule``).
"""

from __future__ import annotations

import json
from typing import Any

import torch
from PIL import Image

from ...core.loader import ModelConfig, resolve_files
from ...diffusion.ddpm import DDPMSchedule
from ..common import (
    ImageNoiseUnit,
    InputImageEmbedderUnit,
    LatentsUnit,
    PromptUnit,
    ShapeCheckUnit,
    TextToLatentPipeline,
    check_call_inputs,
    image_to_tensor,
    load_if_on_disk,
    sibling_folder,
)

__all__ = ["ModelConfig", "StableDiffusionPipeline"]

#: ``scheduler/scheduler_config.json`` of stable-diffusion-v1-5 (a ``PNDMScheduler`` config; only the schedule's
#: values are read), used when the release's file is not on disk.
SD15_SCHEDULER_CONFIG = {
    "beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear", "num_train_timesteps": 1000,
    "set_alpha_to_one": False, "steps_offset": 1, "clip_sample": False, "prediction_type": "epsilon",
}  # fmt: skip


def release_scheduler_config(unet_config: ModelConfig | None) -> dict | None:
    """The ``scheduler/scheduler_config.json`` of the release the UNet came from, when on disk (nothing is
    downloaded); None otherwise."""
    folder = None if unet_config is None else sibling_folder(unet_config, "scheduler")

    def read(config: ModelConfig) -> dict | None:
        files = resolve_files(config)
        path = next((file for file in files if file.name == "scheduler_config.json"), None)
        if path is None and files and files[0].is_dir():
            path = files[0] / "scheduler_config.json"
        return json.loads(path.read_text()) if path is not None and path.is_file() else None

    return load_if_on_disk(folder, read)


class PromptEmbedderUnit(PromptUnit):
    """Encodes the prompt (and, with CFG, the negative prompt) with CLIP, padded to the tokenizer's
    ``model_max_length`` (77) as diffusers does: the last hidden state is ``prompt_emb``."""

    shared_inputs = ()
    text_encoder_entry = "AI-ModelScope/stable-diffusion-v1-5:text_encoder/model.safetensors"

    def process(self, pipe: StableDiffusionPipeline, prompt: str | None) -> dict:
        self.require_text_encoder(pipe)
        tokens = pipe.tokenizer([prompt or ""], padding="max_length", max_length=pipe.tokenizer.model_max_length,
                                truncation=True, return_tensors="pt")
        hidden = pipe.text_encoder(tokens.input_ids.to(pipe.device))[0]
        return {"prompt_emb": hidden.to(pipe.torch_dtype)}


class StableDiffusionPipeline(TextToLatentPipeline):
    """Stable Diffusion 1.x generation and the computation its training shares.

    Build it with ``from_pretrained``; call it with a prompt to get an image. ``model_fn`` is also what training
    calls, on the state the units produce.
    """

    model_roles = {"UNet2DConditionModel": "unet", "AutoencoderKL": "vae", "CLIPTextModel": "text_encoder"}
    denoising_model_names = ("unet",)
    default_tokenizer_config = ModelConfig(model_id="AI-ModelScope/stable-diffusion-v1-5",
                                           origin_file_pattern="tokenizer/")
    #: An empty ``--lora_target_modules`` (the reference's script, and the default) trains every Linear layer of the
    #: UNet: its attention, feed-forward and time-embedding projections.
    default_lora_target_modules = ""
    empty_lora_targets_train_all_linear = True
    model_fn_params = ("prompt_emb",)
    latent_channels = 4
    default_torch_dtype = torch.float32
    #: The call's default height and width, and its default ``cfg_scale`` (the reference's).
    default_size = 512
    default_cfg_scale = 7.5
    training_state = {**TextToLatentPipeline.training_state, "max_sequence_length": None}
    unit_classes = (ShapeCheckUnit, ImageNoiseUnit, InputImageEmbedderUnit, LatentsUnit, PromptEmbedderUnit)

    def _after_init(self) -> None:
        self.scheduler = DDPMSchedule(SD15_SCHEDULER_CONFIG)

    def _after_load(self) -> None:
        """The schedule (and what the UNet learns) comes from the release's ``scheduler/scheduler_config.json``
        beside ``unet/`` when on disk."""
        config = release_scheduler_config(self.model_configs.get("unet"))
        if config is not None:
            self.scheduler = DDPMSchedule({**SD15_SCHEDULER_CONFIG, **config})

    def size_multiple(self) -> int:
        """Pixels per latent cell: the VAE compresses 8x and the UNet pads odd sizes itself."""
        return 8

    def encode_image(self, image: Image.Image) -> torch.Tensor:
        """An image as the UNet's latents ``(1, 4, H/8, W/8)``: the VAE's distribution mode times its
        ``scaling_factor``."""
        pixels = image_to_tensor(image).to(self.device, self.vae.dtype)
        latents = self.vae.encode(pixels).latent_dist.mode() * self.vae.config.scaling_factor
        return latents.to(self.torch_dtype)

    def model_fn(self, latents: torch.Tensor, timestep: torch.Tensor | float, prompt_emb: torch.Tensor,
                 **_: Any) -> torch.Tensor:
        """The UNet's prediction (noise, or velocity) for ``(B, 4, h, w)`` ``latents`` at the discrete ``timestep``;
        extra state keys are ignored."""
        batch = latents.shape[0]
        timestep = torch.as_tensor(timestep, device=latents.device).reshape(-1).expand(batch)
        context = prompt_emb.expand(batch, -1, -1) if prompt_emb.shape[0] == 1 else prompt_emb
        return self.unet(latents, timestep, encoder_hidden_states=context, return_dict=False)[0]

    def decode(self, inputs_shared: dict, inputs_posi: dict, inputs_nega: dict) -> torch.Tensor:
        """The final latents through the VAE, as ``(B, 3, H, W)`` values in ``[0, 1]``; the latents themselves when
        ``output_type`` is ``"latent"``."""
        if inputs_shared.get("output_type") == "latent":
            return inputs_shared["latents"]
        self.load_models_to_device(["vae"])
        latents = inputs_shared["latents"].to(self.vae.dtype) / self.vae.config.scaling_factor
        images = self.vae.decode(latents, return_dict=False)[0]
        return (images / 2 + 0.5).clamp(0, 1)

    @torch.no_grad()
    def __call__(self, prompt: str, negative_prompt: str = "", cfg_scale: float | None = None,
                 input_image: Image.Image | None = None, denoising_strength: float = 1.0, height: int | None = None,
                 width: int | None = None, seed: int | None = None, rand_device: str = "cpu",
                 num_inference_steps: int = 50, output_type: str = "pil",
                 progress_bar: bool = True) -> Image.Image | torch.Tensor:
        """Generates one image.

        Args:
            prompt: What to draw.
            negative_prompt: What to steer away from; used when ``cfg_scale`` is not 1.
            cfg_scale: CFG scale, ``negative + cfg_scale * (positive - negative)``: diffusers' ``guidance_scale``
                (default ``default_cfg_scale``: the reference's 7.5, SDXL's 5); 1 turns CFG off and halves the work
                per step.
            input_image: Start from this image instead of pure noise (image-to-image).
            denoising_strength: With ``input_image``: how much of the schedule to run (1 ignores the image).
            height: Output height in pixels, rounded to a multiple of 8; default ``default_size`` (512, SDXL 1024).
            width: Output width in pixels, rounded to a multiple of 8; default as ``height``.
            seed: Noise seed; ``None`` draws from torch's global generator.
            rand_device: Device the noise is drawn on (CPU noise is the same on every machine).
            num_inference_steps: DDIM steps.
            output_type: ``"pil"`` for a PIL image, ``"pt"`` for a ``(1, 3, H, W)`` tensor in ``[0, 1]``, ``"latent"``
                for the final ``(1, 4, H / 8, W / 8)`` latents.
            progress_bar: Show a progress bar over the steps.
        """
        check_call_inputs(prompt, output_type, output_types=("pil", "pt", "latent"))
        height, width = height or self.default_size, width or self.default_size
        cfg_scale = self.default_cfg_scale if cfg_scale is None else cfg_scale
        self.set_inference_timesteps(num_inference_steps, denoising_strength,
                                     latent_shape=self.image_latent_shape(height, width))
        inputs_shared = {
            "cfg_scale": cfg_scale, "input_image": input_image, "denoising_strength": denoising_strength,
            "height": height, "width": width, "seed": seed, "rand_device": rand_device, "output_type": output_type,
        }  # fmt: skip
        images = self.denoise(inputs_shared, {"prompt": prompt}, {"negative_prompt": negative_prompt},
                              progress_bar=progress_bar)
        return self.image_output(images, output_type)
