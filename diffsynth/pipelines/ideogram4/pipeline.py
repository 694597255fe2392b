"""Ideogram 4 text-to-image as declared units over the diffusers / transformers models.

Models, by pipeline name: ``dit`` (``Ideogram4Transformer2DModel``, the conditional transformer), ``dit_uncond``
(a second ``Ideogram4Transformer2DModel``, the unconditional one; optional: without it ``dit`` runs both branches, as
in the reference), ``vae`` (``AutoencoderKLFlux2``), ``text_encoder`` (Qwen3-VL: ``Qwen3VLModel`` or
``Qwen3VLForConditionalGeneration``; its language model's layers run) and ``tokenizer``. The computation follows
diffusers' ``Ideogram4Pipeline`` step for step:

- the prompt is wrapped in the tokenizer's chat template (one user turn, the generation prompt added); the hidden
  states after decoder layers 0, 3, ..., 33 and 35 are concatenated per token (13 x the encoder's width);
- the transformer reads one packed sequence ``[text | image]``: text features at the text tokens, 2x2-patchified
  latents at the image tokens, ``(t, h, w)`` positions (text: its index on all three axes; image:
  ``(0, row, col) + 65536``), a segment id per token and each token's role; its output at the image tokens is the
  velocity towards the data, the negative of the flow-match velocity the sampler steps with;
- the unconditional branch is the image tokens alone with zero text features (the negative prompt is not read):
  ``negative + cfg_scale * (positive - negative)`` is diffusers' ``guidance_scale * positive + (1 - guidance_scale)
  * negative``;
- latents are normalised with the VAE's batch-norm statistics over the 128 patch channels, ordered patch-major
  (``(row, col, channel)``, not FLUX.2's channel-major order); the time the transformer reads is ``1 - sigma``; the
  schedule is the logit-normal one of ``scheduler.py``.
"""

from __future__ import annotations

from typing import Any

import torch
from PIL import Image

from ...core.loader import ModelConfig
from ..common import (
    PipelineUnit,
    InputImageEmbedderUnit,
    LatentsUnit,
    PromptUnit,
    ShapeCheckUnit,
    TextToLatentPipeline,
    check_call_inputs,
    draw_noise,
    image_to_tensor,
    prompt_only_problems,
    vision_language_model,
)
from ..flux2_klein.pipeline import VAE_SCALE, patchify, unpatchify
from .scheduler import Ideogram4Scheduler

__all__ = ["Ideogram4Pipeline", "ModelConfig"]

DEFAULT_SIZE = 1024
MAX_TEXT_TOKENS = 2048
# The Qwen3-VL decoder layers whose outputs are the text features (diffusers' QWEN3_VL_ACTIVATION_LAYERS).
ACTIVATION_LAYERS = (0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 33, 35)
# Token roles and the image positions' offset, as the transformer reads them (diffusers' constants).
PADDING_SEGMENT, IMAGE_TOKEN, TEXT_TOKEN = -1, 2, 3
IMAGE_POSITION_OFFSET = 65536
PATCH_CELLS = 4  # a 2x2 patch

MODEL_ROLES = {
    "Ideogram4Transformer2DModel": "dit",
    "AutoencoderKLFlux2": "vae",
    "Qwen3VLModel": "text_encoder",
    "Qwen3VLForConditionalGeneration": "text_encoder",
}


def to_patch_major(latents: torch.Tensor) -> torch.Tensor:
    """FLUX.2's channel-major patch channels ``(channel, row, col)`` to Ideogram's ``(row, col, channel)``."""
    batch, channels, height, width = latents.shape
    cells = latents.view(batch, channels // PATCH_CELLS, PATCH_CELLS, height, width).transpose(1, 2)
    return cells.reshape(batch, channels, height, width)


def to_channel_major(latents: torch.Tensor) -> torch.Tensor:
    """Inverse of ``to_patch_major``."""
    batch, channels, height, width = latents.shape
    cells = latents.view(batch, PATCH_CELLS, channels // PATCH_CELLS, height, width).transpose(1, 2)
    return cells.reshape(batch, channels, height, width)


def text_features(text_encoder: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """The concatenated outputs of the ``ACTIVATION_LAYERS`` decoder layers for one unpadded prompt ``(1, n)``.

    Raises:
        ValueError: The encoder has fewer layers than the taps need (Ideogram 4 reads Qwen3-VL-8B's 36).
    """
    from transformers.masking_utils import create_causal_mask

    model = vision_language_model(text_encoder).language_model
    if len(model.layers) <= ACTIVATION_LAYERS[-1]:
        raise ValueError(f"the text encoder has {len(model.layers)} layers; Ideogram 4 reads layer "
                         f"{ACTIVATION_LAYERS[-1]}: load the release's text_encoder (Qwen3-VL, 36 layers)")
    hidden = model.embed_tokens(input_ids)
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
    mask = create_causal_mask(config=model.config, inputs_embeds=hidden, attention_mask=torch.ones_like(input_ids),
                              past_key_values=None, position_ids=positions)
    rotary = model.rotary_emb(hidden, positions[None].expand(3, -1, -1))
    taps = []
    for index, layer in enumerate(model.layers[:ACTIVATION_LAYERS[-1] + 1]):
        hidden = layer(hidden, attention_mask=mask, position_ids=positions, past_key_values=None,
                       position_embeddings=rotary)
        if index in ACTIVATION_LAYERS:
            taps.append(hidden)
    return torch.cat([tap.unsqueeze(-1) for tap in taps], dim=-1).flatten(2)


class NoiseUnit(PipelineUnit):
    """Draws the initial noise as diffusers does, one row of 128 per image token, as ``(1, 128, H/16, W/16)``."""

    def __init__(self) -> None:
        super().__init__(input_params=("height", "width", "seed", "rand_device"), output_params=("noise",))

    def process(self, pipe: Ideogram4Pipeline, height: int, width: int, seed: int | None,
                rand_device: str | torch.device | None) -> dict:
        rows, columns = height // VAE_SCALE, width // VAE_SCALE
        noise = draw_noise(pipe, (1, rows * columns, pipe.latent_channels), seed, rand_device)
        return {"noise": noise.transpose(1, 2).reshape(1, pipe.latent_channels, rows, columns)}


class PromptEmbedderUnit(PromptUnit):
    """Encodes the prompt with Qwen3-VL under its chat template; the negative branch reads no text (diffusers and the
    reference drop it), so it is encoded as ``None``.

    Outputs ``prompt_emb`` ``(1, tokens, 13 * hidden)`` or None, and ``prompt_emb_mask`` None (one prompt has no
    padding; batches pad through ``padded_inputs``).
    """

    shared_inputs = ()
    outputs = ("prompt_emb", "prompt_emb_mask")
    text_encoder_entry = "ideogram-ai/ideogram-v4:text_encoder/model*.safetensors"

    def __init__(self) -> None:
        # The negative branch looks its text up under a key no caller sets, so it gets None.
        PipelineUnit.__init__(self, separate_cfg=True, input_params_posi={"prompt": "prompt"},
                              input_params_nega={"prompt": "unconditional_text"}, output_params=self.outputs,
                              onload_model_names=self.encoders)

    def process(self, pipe: Ideogram4Pipeline, prompt: str | None = None) -> dict:
        if prompt is None:
            return {"prompt_emb": None, "prompt_emb_mask": None}
        self.require_text_encoder(pipe)
        messages = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
        text = pipe.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = pipe.tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        if ids.shape[1] > MAX_TEXT_TOKENS:
            raise ValueError(f"the prompt has {ids.shape[1]} tokens; Ideogram 4 reads at most {MAX_TEXT_TOKENS}")
        return {"prompt_emb": text_features(pipe.text_encoder, ids.to(pipe.device)).float(), "prompt_emb_mask": None}


class Ideogram4Pipeline(TextToLatentPipeline):
    """Ideogram 4 generation and the computation its training shares.

    Build it with ``from_pretrained``; call it with a prompt to get an image. ``model_fn`` is also what training
    calls, on the state the units produce.
    """

    model_roles = MODEL_ROLES
    default_tokenizer_config = ModelConfig(model_id="ideogram-ai/ideogram-4-fp8", origin_file_pattern="tokenizer/")
    default_lora_target_modules = "to_q,to_k,to_v,to_out.0,w1,w2,w3,adaln_modulation"
    #: The reference's --lora_target_modules name its fused attention projections.
    lora_target_aliases = {"attention.qkv": (r".*\.attention\.to_[qkv]",), "attention.o": "attention.to_out.0"}
    model_fn_params = ("prompt_emb", "prompt_emb_mask")
    #: A batch pads prompt features to its longest prompt; ``model_fn`` leaves the padding out of attention.
    padded_inputs = {"prompt_emb": "prompt_emb_mask"}
    latent_channels = 128
    pixels_per_latent = VAE_SCALE
    latent_patch_size = 1
    extra_attributes = {"dit_uncond": None}
    denoising_model_names = ("dit", "dit_uncond")
    unit_classes = (ShapeCheckUnit, NoiseUnit, InputImageEmbedderUnit, LatentsUnit, PromptEmbedderUnit)

    def _after_init(self) -> None:
        self.scheduler = Ideogram4Scheduler()

    @classmethod
    def slots_of(cls, class_names: list[str | None]) -> list[str | None]:
        """As ``BasePipeline.slots_of``; the second transformer is the unconditional one, ``dit_uncond``."""
        slots = super().slots_of(class_names)
        transformers = [index for index, slot in enumerate(slots) if slot == "dit"]
        if len(transformers) > 1:
            slots[transformers[1]] = "dit_uncond"
        return slots

    def _assign(self, component: Any, config: ModelConfig) -> str:
        """As ``BasePipeline._assign``; a second transformer (``unconditional_transformer/``) is ``dit_uncond``."""
        if self.model_roles.get(type(component).__name__) == "dit" and self.dit is not None:
            self.dit_uncond = component
            self.model_configs["dit_uncond"] = config
            return "dit_uncond"
        return super()._assign(component, config)

    def latent_statistics(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The VAE's batch-norm mean and ``1 / sqrt(var + eps)`` over the 128 patch-major channels."""
        bn, shape = self.vae.bn, (1, -1) + (1,) * (like.dim() - 2)
        mean = bn.running_mean.view(shape).to(like.device, like.dtype)
        std = torch.sqrt(bn.running_var.view(shape) + self.vae.config.batch_norm_eps).to(like.device, like.dtype)
        return mean, 1.0 / std

    def encode_image(self, image: Image.Image) -> torch.Tensor:
        """An RGB image (sides multiples of 16) as normalised patch-major latents ``(1, 128, H/16, W/16)``, from the
        VAE's distribution mode."""
        pixels = image_to_tensor(image).to(self.device, self.vae.dtype)
        latents = to_patch_major(patchify(self.vae.encode(pixels).latent_dist.mode()))
        mean, inverse_std = self.latent_statistics(latents)
        return ((latents - mean) * inverse_std).to(self.torch_dtype)

    def decode(self, inputs_shared: dict, inputs_posi: dict, inputs_nega: dict) -> torch.Tensor:
        """The final latents de-normalised, unpatchified and decoded by the VAE, as ``(B, 3, H, W)`` in ``[0, 1]``."""
        self.load_models_to_device(["vae"])
        latents = inputs_shared["latents"].float()
        mean, inverse_std = self.latent_statistics(latents)
        latents = unpatchify(to_channel_major(latents / inverse_std + mean))
        images = self.vae.decode(latents.to(self.vae.dtype), return_dict=False)[0].float()
        return (images / 2 + 0.5).clamp(0, 1)

    def model_fn(self, latents: torch.Tensor, timestep: torch.Tensor | float, prompt_emb: torch.Tensor | None,
                 prompt_emb_mask: torch.Tensor | None = None, **_: Any) -> torch.Tensor:
        """The flow-match velocity for ``(B, 128, h, w)`` latents at ``timestep`` (scale 0 to 1000).

        ``prompt_emb`` None is the unconditional branch: the image tokens alone, on ``dit_uncond`` when loaded.
        ``prompt_emb_mask`` marks a padded batch's real tokens (None: every token is real); padding takes no part in
        attention, as diffusers' padding segment. Extra state keys are ignored, since the loop passes the whole state.
        """
        batch, channels, rows, columns = latents.shape
        device, image_tokens = latents.device, rows * columns
        dit = self.dit
        if prompt_emb is None:
            dit = self.dit if self.dit_uncond is None else self.dit_uncond
            prompt_emb = latents.new_zeros(batch, 0, dit.config.llm_features_dim)
        text_tokens = prompt_emb.shape[1]
        real = (torch.ones(batch, text_tokens, dtype=torch.bool, device=device) if prompt_emb_mask is None
                else prompt_emb_mask.bool().to(device).expand(batch, -1))
        # Text positions count real tokens, on all three axes; image positions are (0, row, col) past the offset.
        text_positions = (real.long().cumsum(dim=1) - 1).clamp(min=0)[..., None].expand(-1, -1, 3)
        grid = torch.stack(torch.meshgrid(torch.arange(rows), torch.arange(columns), indexing="ij"), dim=-1)
        image_positions = torch.cat([torch.zeros(image_tokens, 1, dtype=torch.long), grid.reshape(-1, 2)], dim=1)
        positions = torch.cat([text_positions, (image_positions + IMAGE_POSITION_OFFSET).to(device)
                               .expand(batch, -1, -1)], dim=1)
        indicator = torch.cat([real.long() * TEXT_TOKEN, torch.full((batch, image_tokens), IMAGE_TOKEN, device=device)],
                              dim=1)
        segments = torch.cat([torch.where(real, 1, PADDING_SEGMENT), torch.ones(batch, image_tokens, dtype=torch.long,
                                                                              device=device)], dim=1)
        features = torch.cat([prompt_emb.to(dit.dtype).expand(batch, -1, -1),
                              prompt_emb.new_zeros(batch, image_tokens, prompt_emb.shape[-1]).to(dit.dtype)], dim=1)
        image = latents.flatten(2).transpose(1, 2)
        hidden = torch.cat([image.new_zeros(batch, text_tokens, channels), image], dim=1).to(dit.dtype)
        time = (1.0 - torch.as_tensor(timestep, device=device).float().reshape(-1) / 1000).expand(batch)
        output = dit(hidden_states=hidden, timestep=time.to(dit.dtype), encoder_hidden_states=features,
                     position_ids=positions, segment_ids=segments, indicator=indicator, return_dict=False)[0]
        velocity = -output[:, text_tokens:].to(latents.dtype)
        return velocity.transpose(1, 2).reshape(batch, channels, rows, columns)

    def sample_input_problems(self, inputs: set[str]) -> list[str]:
        """Ideogram 4 renders from the prompt alone."""
        return prompt_only_problems("Ideogram 4", inputs)

    @torch.no_grad()
    def __call__(self, prompt: str, negative_prompt: str = "", cfg_scale: float = 7.0,
                 input_image: Image.Image | None = None, denoising_strength: float = 1.0, height: int | None = None,
                 width: int | None = None, seed: int | None = None, rand_device: str = "cpu",
                 num_inference_steps: int = 50, mu: float = 0.0, std: float = 1.5, output_type: str = "pil",
                 progress_bar: bool = True) -> Image.Image | torch.Tensor:
        """Generates one image.

        Args:
            prompt: What to draw (Ideogram 4 was trained on structured JSON captions; plain text works too).
            negative_prompt: Accepted for the reference's signature and not read: the unconditional branch has no
                text.
            cfg_scale: CFG scale, ``negative + cfg_scale * (positive - negative)`` (diffusers' constant
                ``guidance_scale``); 1 turns CFG off.
            input_image: Start from this image instead of pure noise (image-to-image).
            denoising_strength: With ``input_image``: how much of the schedule to run (1 ignores the image).
            height: Output height in pixels, rounded to a multiple of 16; default 1024.
            width: Output width in pixels, rounded to a multiple of 16; default 1024.
            seed: Noise seed; ``None`` draws from torch's global generator.
            rand_device: Device the noise is drawn on (CPU noise is the same on every machine).
            num_inference_steps: Denoising steps (the reference: 48 to 50).
            mu: The logit-normal schedule's mean at 512 x 512 (shifted by the resolution).
            std: The logit-normal schedule's standard deviation.
            output_type: ``"pil"`` for a PIL image, ``"pt"`` for a ``(1, 3, H, W)`` tensor in ``[0, 1]``.
            progress_bar: Show a progress bar over the steps.
        """
        check_call_inputs(prompt, output_type)
        height, width = height or DEFAULT_SIZE, width or DEFAULT_SIZE
        latent_shape = self.image_latent_shape(height, width)
        self.scheduler.set_timesteps(num_inference_steps, denoising_strength,
                                     image_seq_len=latent_shape[-2] * latent_shape[-1], mu=mu, std=std)
        inputs_shared = {
            "cfg_scale": cfg_scale, "input_image": input_image, "denoising_strength": denoising_strength,
            "height": height, "width": width, "seed": seed, "rand_device": rand_device,
        }  # fmt: skip
        images = self.denoise(inputs_shared, {"prompt": prompt}, {"negative_prompt": negative_prompt},
                              progress_bar=progress_bar)
        return self.image_output(images, output_type)
