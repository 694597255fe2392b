"""Z-Image and Z-Image-Turbo text-to-image as declared units over the diffusers / transformers models.

Models, by pipeline name: ``dit`` (``ZImageTransformer2DModel``), ``vae`` (``AutoencoderKL``, 16 latent channels),
``text_encoder`` (``Qwen3Model``) and ``tokenizer``. The computation follows diffusers' ``ZImagePipeline`` step for
step: the prompt goes through Qwen3's chat template (with ``enable_thinking``) and the encoder's second-to-last hidden
states of its real tokens are the caption; the transformer takes lists of per-sample latents and captions and the
timestep ``(1000 - t) / 1000``, and its output is the negated velocity; latents are normalised with the VAE's
``scaling_factor`` and ``shift_factor``; the schedule is flow-match Euler on ``linspace(1, 1/N, N)`` with the static
shift of the release's ``scheduler/scheduler_config.json`` (3 when that file is not on disk, the reference's value).

CFG: ``cfg_scale`` follows the reference trainer (``negative + cfg_scale * (positive - negative)``, 1 is off), which is
diffusers' ``guidance_scale + 1``; ``cfg_normalization`` and ``cfg_truncation`` are diffusers' options of the same
names. Training draws timesteps from the reference's grid (shift 3) whatever the release's inference shift.

Z-Image-Omni-Base (a transformer with ``siglip_feat_dim``) adds a ``siglip`` model (``Siglip2VisionModel``) and
condition images, ``edit_image``; it follows diffusers' ``ZImageOmniPipeline`` (see ``omni.py``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import torch
from PIL import Image

from ...core.data.cells import real
from ...core.loader import ModelConfig, resolve_files
from ...diffusion.flow_match import FlowMatchScheduler
from ..registry import scheduler_preset
from ..common import PromptUnit, ScaledLatentPipeline, TextToLatentPipeline, check_call_inputs, image_units
from .controlnet import ControlNetConditionUnit, ControlNetInput, controlnet_block_samples
from .omni import (
    OmniConditionEmbedderUnit,
    default_siglip_processor_config,
    encode_omni_prompt,
    is_omni,
    load_siglip_processor,
    omni_model_fn,
    output_size,
    siglip_processor_if_present,
)

__all__ = ["ControlNetInput", "ModelConfig", "ZImagePipeline", "ZImageScheduler"]

logger = logging.getLogger(__name__)

DEFAULT_SIZE = 1024
TOKENIZER_MAX_LENGTH = 512
# diffusers reads the caption from the encoder's second-to-last hidden states.
CAPTION_HIDDEN_LAYER = -2

# The reference trainer's schedule (the spec's preset), and Z-Image-Turbo's released one.
TRAINING_SHIFT = scheduler_preset("z_image")["shift"]

MODEL_ROLES = {
    "ZImageTransformer2DModel": "dit",
    "AutoencoderKL": "vae",
    "Qwen3Model": "text_encoder",
    "Qwen3ForCausalLM": "text_encoder",
    "Siglip2VisionModel": "siglip",
    "ZImageControlNetModel": "controlnet",
}


class ZImageScheduler(FlowMatchScheduler):
    """Flow-match Euler whose inference schedule uses a release's static shift while training draws from the
    reference trainer's grid (the ``z_image`` preset, shift 3), so one run trains alike on Z-Image and Turbo.

    Args:
        inference_shift: The static shift of the sampling schedule (the release's ``scheduler_config.json``).
    """

    def __init__(self, inference_shift: float = TRAINING_SHIFT) -> None:
        super().__init__(**scheduler_preset("z_image"))
        if inference_shift <= 0:
            raise ValueError(f"inference_shift={inference_shift} must be positive; use 3.0 (Z-Image-Turbo)")
        # The training grid was bent at construction; the shift read from here on is the sampling schedule's.
        self.shift = float(inference_shift)


def release_shift(dit_config: ModelConfig | None) -> float | None:
    """The ``shift`` of ``scheduler/scheduler_config.json`` beside the transformer's folder, when that file is on
    disk (nothing is downloaded); None otherwise."""
    if dit_config is None:
        return None
    try:
        files = resolve_files(ModelConfig(path=dit_config.path, model_id=dit_config.model_id,
                                          origin_file_pattern=dit_config.origin_file_pattern, skip_download=True))
    except FileNotFoundError:
        return None
    first = files[0] if files else None
    if first is None:
        return None
    path = (first if first.is_dir() else first.parent).parent / "scheduler" / "scheduler_config.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text())
    if config.get("use_dynamic_shifting"):
        logger.warning("%s asks for dynamic shifting, which Z-Image releases do not use; using its static shift", path)
    return float(config.get("shift", TRAINING_SHIFT))




class PromptEmbedderUnit(PromptUnit):
    """Encodes the prompt (and, with CFG, the negative prompt) with Qwen3 through its chat template.

    Outputs the second-to-last hidden states of the first ``max_sequence_length`` tokens and a mask that is ``None``
    (one prompt has no padding; batches pad through ``padded_inputs``). For an Omni transformer the prompt is cut
    into segments around the condition images instead (``omni.encode_omni_prompt``), and
    ``prompt_emb_lengths`` holds their token counts (None otherwise).
    """

    shared_inputs = ("max_sequence_length", "edit_image")
    outputs = ("prompt_emb", "prompt_emb_mask", "prompt_emb_lengths")
    text_encoder_entry = "Tongyi-MAI/Z-Image-Turbo:text_encoder/*.safetensors"

    def process(self, pipe: ZImagePipeline, prompt: str | None, max_sequence_length: int | None,
                edit_image: Image.Image | Sequence[Image.Image] | None = None) -> dict:
        self.require_text_encoder(pipe)
        if is_omni(pipe.dit):
            count = 0 if edit_image is None else len(edit_image) if isinstance(edit_image, (list, tuple)) else 1
            emb, lengths = encode_omni_prompt(pipe, prompt or "", count, max_sequence_length or TOKENIZER_MAX_LENGTH,
                                              CAPTION_HIDDEN_LAYER)
            return {"prompt_emb": emb, "prompt_emb_mask": None, "prompt_emb_lengths": lengths}
        text = pipe.tokenizer.apply_chat_template([{"role": "user", "content": prompt or ""}], tokenize=False,
                                                  add_generation_prompt=True, enable_thinking=True)
        # Without padding: the encoder is causal, so padding to max_length (as diffusers does) changes no real token.
        tokens = pipe.tokenizer([text], max_length=max_sequence_length or TOKENIZER_MAX_LENGTH, truncation=True,
                                return_tensors="pt").to(pipe.device)
        hidden = pipe.text_encoder(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask.bool(),
                                   output_hidden_states=True).hidden_states[CAPTION_HIDDEN_LAYER]
        return {"prompt_emb": hidden.to(pipe.torch_dtype), "prompt_emb_mask": None, "prompt_emb_lengths": None}


class ZImagePipeline(ScaledLatentPipeline):
    """Z-Image / Z-Image-Turbo generation and the computation its training shares.

    Build it with ``from_pretrained``; call it with a prompt to get an image. ``model_fn`` is also what training
    calls, on the state the units produce.
    """

    model_roles = MODEL_ROLES
    default_tokenizer_config = ModelConfig(model_id="Tongyi-MAI/Z-Image-Turbo", origin_file_pattern="tokenizer/")
    default_lora_target_modules = "to_q,to_k,to_v,to_out.0,w1,w2,w3"
    model_fn_params = ("prompt_emb", "prompt_emb_mask", "prompt_emb_lengths", "edit_latents", "edit_siglip",
                       "control_context", "control_scale")
    #: Z-Image-Omni-Base's condition images and the Fun ControlNets' control image.
    image_inputs = ("edit_image", "controlnet_image")
    #: A batch pads prompt embeddings to its longest prompt; ``model_fn`` cuts each back to its real tokens.
    padded_inputs = {"prompt_emb": "prompt_emb_mask"}
    scheduler_preset = "z_image"
    input_types = {**TextToLatentPipeline.input_types, "cfg_normalization": real, "cfg_truncation": real}
    unplaceable_models = {"controlnet": "it computes with the transformer's modules, which the transformer's "
                                        "offload or swap moves"}
    #: Z-Image-Omni-Base's SigLIP2 image processor (loaded on first use if unset).
    extra_attributes = {"siglip_processor": None}
    unit_classes = (*image_units(OmniConditionEmbedderUnit, PromptEmbedderUnit), ControlNetConditionUnit)

    def _after_init(self) -> None:
        super()._after_init()
        self.scheduler = ZImageScheduler()

    def _after_load(self) -> None:
        """The sampling schedule takes the shift of the transformer's release (``scheduler/scheduler_config.json``
        beside ``transformer/``, when on disk). With a SigLIP model, its ``siglip_processor/`` folder is loaded too
        when on disk (else downloaded on first use)."""
        if self.controlnet is not None:
            # The ControlNet computes in every step beside the transformer (an instance setting: pipelines without
            # one keep the class's).
            self.denoising_model_names = ("dit", "controlnet")
            # diffusers' ZImageControlNetModel reads this flag in training but never sets it, and
            # enable_gradient_checkpointing looks for it.
            self.controlnet.gradient_checkpointing = False
        shift = release_shift(self.model_configs.get("dit"))
        if shift is not None:
            self.scheduler = ZImageScheduler(inference_shift=shift)
        self.siglip_processor = siglip_processor_if_present(default_siglip_processor_config(
            self.model_configs.get("siglip")))

    @classmethod
    def _companions(cls, roles: dict[str, ModelConfig], tokenizer_config: ModelConfig | None) -> dict[str, ModelConfig]:
        """The tokenizer as in ``BasePipeline``, plus the SigLIP2 image processor beside a SigLIP model."""
        companions = super()._companions(roles, tokenizer_config)
        processor = default_siglip_processor_config(roles.get("siglip"))
        if processor is not None:
            companions["siglip_processor"] = processor
        return companions

    def omni_siglip_processor(self) -> Any:
        """The SigLIP2 image processor, loaded (and downloaded if missing) beside the SigLIP model on first use."""
        if self.siglip_processor is None:
            config = default_siglip_processor_config(self.model_configs.get("siglip")) or ModelConfig(
                model_id="Tongyi-MAI/Z-Image-Omni-Base", origin_file_pattern="siglip_processor/")
            self.siglip_processor = load_siglip_processor(config)
        return self.siglip_processor

    def model_fn(self, latents: torch.Tensor, timestep: torch.Tensor | float, prompt_emb: torch.Tensor,
                 prompt_emb_mask: torch.Tensor | None = None, prompt_emb_lengths: torch.Tensor | None = None,
                 edit_latents: Sequence[torch.Tensor] | None = None, edit_siglip: Sequence[torch.Tensor] | None = None,
                 control_context: torch.Tensor | None = None, control_scale: float | None = None,
                 **_: Any) -> torch.Tensor:
        """The velocity ``noise - x0`` for ``(B, 16, h, w)`` ``latents`` at ``timestep`` (scale 0 to 1000).

        The transformer reads one latent ``(16, 1, h, w)`` and one caption of its real tokens per sample and the
        timestep as ``(1000 - t) / 1000``; it predicts the negated velocity. An Omni transformer runs in omni mode,
        with the condition images' latents and SigLIP grids (``omni.omni_model_fn``). With ``control_context`` the
        Fun ControlNet's hints are added to the main blocks (``controlnet.controlnet_block_samples``). Extra state
        keys are ignored.
        """
        batch = latents.shape[0]
        timestep = torch.as_tensor(timestep, dtype=torch.float32, device=latents.device).reshape(-1).expand(batch)
        if is_omni(self.dit):
            if control_context is not None:
                raise ValueError("the Z-Image Fun ControlNets are for Z-Image-Turbo; Z-Image-Omni-Base takes none")
            return omni_model_fn(self, latents, timestep, prompt_emb, prompt_emb_mask, prompt_emb_lengths,
                                 edit_latents, edit_siglip)
        if prompt_emb_mask is None:
            captions = list(prompt_emb.expand(batch, -1, -1).unbind(0))
        else:
            captions = [emb[mask.bool()] for emb, mask in zip(prompt_emb, prompt_emb_mask)]
        frames = list(latents.unsqueeze(2).unbind(0))
        t = (1000 - timestep) / 1000
        hints = controlnet_block_samples(self, frames, t, captions, control_context, control_scale)
        prediction = self.dit(frames, t, captions, controlnet_block_samples=hints, return_dict=False)[0]
        return -torch.stack(prediction).squeeze(2)

    def predict_noise(self, inputs_shared: dict, inputs_posi: dict, inputs_nega: dict,
                      timestep: Any) -> torch.Tensor:
        """The prediction with diffusers' CFG options: none when ``cfg_scale`` is 1 or the step's progress
        ``(1000 - t) / 1000`` exceeds ``cfg_truncation``; the guided result's norm capped at ``cfg_normalization``
        times the positive one's when that is positive."""
        cfg_scale = inputs_shared.get("cfg_scale", 1)
        truncation = inputs_shared.get("cfg_truncation")
        unguided = {**inputs_shared, "cfg_scale": 1}
        positive = super().predict_noise(unguided, inputs_posi, inputs_nega, timestep)
        if cfg_scale == 1 or (truncation is not None and truncation <= 1 and (1000 - float(timestep)) / 1000
                              > truncation):
            return positive
        # The base class merges its second argument as the branch, so this is the negative pass.
        negative = super().predict_noise(unguided, inputs_nega, inputs_posi, timestep)
        guided = self.guide(positive, negative, cfg_scale)
        normalization = float(inputs_shared.get("cfg_normalization") or 0)
        if normalization > 0:
            dims = tuple(range(1, guided.dim()))
            limit = torch.linalg.vector_norm(positive.float(), dim=dims, keepdim=True) * normalization
            norm = torch.linalg.vector_norm(guided.float(), dim=dims, keepdim=True)
            guided = torch.where(norm > limit, guided * (limit / norm), guided.float()).to(guided.dtype)
        return guided

    def decode(self, inputs_shared: dict, inputs_posi: dict, inputs_nega: dict) -> torch.Tensor:
        """The final latents through the VAE, as ``(B, 3, H, W)`` values in ``[0, 1]``; the latents themselves when
        ``output_type`` is ``"latent"``."""
        if inputs_shared.get("output_type") == "latent":
            return inputs_shared["latents"]
        return super().decode(inputs_shared, inputs_posi, inputs_nega)

    def sample_input_problems(self, inputs: set[str]) -> list[str]:
        """Z-Image renders from a prompt; condition images (``edit_image``) need Z-Image-Omni-Base's transformer."""
        problems = []
        if "edit_image" in inputs and not is_omni(self.dit):
            problems.append('"edit_image" is for Z-Image-Omni-Base; this transformer reads no condition images')
        if "input_image" in inputs:
            problems.append('"input_image" is for Wan image-to-video; Z-Image renders from the prompt alone')
        return problems

    @torch.no_grad()
    def __call__(self, prompt: str, negative_prompt: str = "", cfg_scale: float = 1.0,
                 cfg_normalization: float = 0.0, cfg_truncation: float = 1.0, input_image: Image.Image | None = None,
                 edit_image: Image.Image | Sequence[Image.Image] | None = None,
                 controlnet_inputs: Sequence[ControlNetInput] | None = None, denoising_strength: float = 1.0,
                 height: int | None = None, width: int | None = None,
                 seed: int | None = None, rand_device: str = "cpu", num_inference_steps: int = 8,
                 max_sequence_length: int = TOKENIZER_MAX_LENGTH, output_type: str = "pil",
                 progress_bar: bool = True) -> Image.Image | torch.Tensor:
        """Generates one image.

        Args:
            prompt: What to draw.
            negative_prompt: What to steer away from; used when ``cfg_scale`` is not 1.
            cfg_scale: CFG scale, ``negative + cfg_scale * (positive - negative)``: diffusers' ``guidance_scale`` + 1.
                1 (Z-Image-Turbo's setting) turns CFG off and halves the work per step; Z-Image takes about 4 to 6.
            cfg_normalization: Caps the guided prediction's norm at this multiple of the positive one's; 0 is off
                (diffusers' ``cfg_normalization``, where True means 1).
            cfg_truncation: CFG only while the step's progress ``(1000 - t) / 1000`` is at most this; 1 keeps it on
                every step (diffusers' ``cfg_truncation``).
            input_image: Start from this image instead of pure noise (image-to-image).
            edit_image: Z-Image-Omni-Base's condition image, or a list of them (diffusers' ``image``).
            controlnet_inputs: The Fun ControlNet's input, ``[ControlNetInput(image=..., scale=...)]`` (diffusers'
                ``control_image`` and ``controlnet_conditioning_scale``); needs the ``controlnet`` model.
            denoising_strength: With ``input_image``: how much of the schedule to run (1 ignores the image).
            height: Output height in pixels, rounded to a multiple of 16; default 1024, or with ``edit_image`` the
                last condition image's (cropped to multiples of 16), as diffusers does.
            width: Output width in pixels, rounded to a multiple of 16; default as ``height``.
            seed: Noise seed; ``None`` draws from torch's global generator.
            rand_device: Device the noise is drawn on (CPU noise is the same on every machine).
            num_inference_steps: Denoising steps (Turbo: 8; Z-Image: 28 to 50).
            max_sequence_length: Prompt tokens kept, template included (at most 512).
            output_type: ``"pil"`` for a PIL image, ``"pt"`` for a ``(1, 3, H, W)`` tensor in ``[0, 1]``, ``"latent"``
                for the final ``(1, 16, H / 8, W / 8)`` latents (not decoded, as diffusers' ``output_type="latent"``).
            progress_bar: Show a progress bar over the steps.
        """
        check_call_inputs(prompt, output_type, max_sequence_length, TOKENIZER_MAX_LENGTH,
                          output_types=("pil", "pt", "latent"))
        if cfg_normalization < 0:
            raise ValueError(f"cfg_normalization={cfg_normalization} must be 0 (off) or positive, e.g. 1.0")
        default_height, default_width = (DEFAULT_SIZE, DEFAULT_SIZE) if edit_image is None else output_size(edit_image)
        height, width = height or default_height, width or default_width
        self.set_inference_timesteps(num_inference_steps, denoising_strength,
                                     latent_shape=self.image_latent_shape(height, width))
        inputs_shared = {
            "cfg_scale": cfg_scale, "cfg_normalization": cfg_normalization, "cfg_truncation": cfg_truncation,
            "input_image": input_image, "edit_image": edit_image, "controlnet_inputs": controlnet_inputs,
            "denoising_strength": denoising_strength,
            "height": height, "width": width,
            "seed": seed, "rand_device": rand_device, "max_sequence_length": max_sequence_length,
            "output_type": output_type,
        }  # fmt: skip
        images = self.denoise(inputs_shared, {"prompt": prompt}, {"negative_prompt": negative_prompt},
                              progress_bar=progress_bar)
        return self.image_output(images, output_type)
