"""Qwen-Image text-to-image, image-to-image and image editing as declared units over the diffusers / transformers
models.

Models, by pipeline name: ``dit`` (``QwenImageTransformer2DModel``), ``vae`` (``AutoencoderKLQwenImage``),
``text_encoder`` (``Qwen2_5_VLForConditionalGeneration``), ``tokenizer`` and, for editing, ``processor`` (the
Qwen2.5-VL processor). The computation follows diffusers' ``QwenImagePipeline`` step for step (prompt template, latent
packing, flow-matching schedule with Qwen-Image's resolution-dependent shift, CFG with norm rescaling, latent
de-normalisation), so both produce the same image from the same weights and seed; with ``edit_image`` it follows
``QwenImageEditPipeline`` / ``QwenImageEditPlusPipeline`` (see ``edit.py``). Latents live in the state
unpacked, ``(batch, 16, height / 8, width / 8)``; ``model_fn`` packs them into 2x2 patches for the transformer and
unpacks its prediction.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from PIL import Image

from ...core.loader import ModelConfig, model_class_name
from ...core.data.cells import non_negative_integer
from ..common import (
    LatentsUnit,
    PromptUnit,
    ShapeCheckUnit,
    TextToLatentPipeline,
    check_call_inputs,
    tensor_to_images,
    pack_latents,
    unpack_latents,
)
from .context import ContextImageUnit
from .edit import (
    EDIT_CONDITION_PIXELS,
    EDIT_IMAGE_PIXELS,
    EDIT_TEMPLATE_DROP_TOKENS,
    EditImageEmbedderUnit,
    default_processor_config,
    edit_image_size,
    encode_edit_prompt,
    load_processor,
    output_size,
    processor_if_present,
    set_zero_cond_t,
)
from .layered import (
    LAYERED_DEFAULT_PIXELS,
    LayeredInputImageUnit,
    LayeredNoiseUnit,
    LayerInputImageUnit,
    check_layer_num,
    decode_frames,
    encode_frames,
    layered_mu,
    pack_frames,
    unpack_frames,
)

__all__ = ["ModelConfig", "QwenImagePipeline", "pack_latents", "unpack_latents"]

logger = logging.getLogger(__name__)

# The Qwen2.5-VL chat template the model was trained with; its first 34 tokens (the system turn and the user
# header) are dropped from the encoder output.
PROMPT_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial "
    "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)
PROMPT_TEMPLATE_DROP_TOKENS = 34
TOKENIZER_MAX_LENGTH = 1024
DEFAULT_SIZE = 1328

# Pipeline name of each model class.
MODEL_ROLES = {
    "QwenImageTransformer2DModel": "dit",
    "AutoencoderKLQwenImage": "vae",
    "Qwen2_5_VLForConditionalGeneration": "text_encoder",
}


class PromptEmbedderUnit(PromptUnit):
    """Encodes the prompt (and, with CFG, the negative prompt) with Qwen2.5-VL through the chat template.

    With ``edit_image`` the edit images are encoded with the prompt, in the Edit template (see
    ``qwen_image_edit.encode_edit_prompt``), and nothing is truncated; otherwise the text-to-image template is used
    and at most ``max_sequence_length`` tokens are kept. Outputs the last hidden states after the template's system
    turn and a mask that is ``None`` when no token is padding (always, for one prompt).
    """

    shared_inputs = ("max_sequence_length", "edit_image")
    outputs = ("prompt_emb", "prompt_emb_mask")
    text_encoder_entry = "Qwen/Qwen-Image:text_encoder/model*.safetensors"

    def process(self, pipe: QwenImagePipeline, prompt: str | None, max_sequence_length: int | None,
                edit_image: Image.Image | Sequence[Image.Image] | None) -> dict:
        self.require_text_encoder(pipe)
        if edit_image is not None:
            hidden, mask = encode_edit_prompt(pipe, prompt or "", edit_image)
            drop, limit = EDIT_TEMPLATE_DROP_TOKENS, None
        else:
            tokens = pipe.tokenizer([PROMPT_TEMPLATE.format(prompt or "")],
                                    max_length=TOKENIZER_MAX_LENGTH + PROMPT_TEMPLATE_DROP_TOKENS, padding=True,
                                    truncation=True, return_tensors="pt").to(pipe.device)
            hidden = pipe.text_encoder(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask,
                                       output_hidden_states=True).hidden_states[-1]
            mask, drop, limit = tokens.attention_mask, PROMPT_TEMPLATE_DROP_TOKENS, max_sequence_length or 512
        kept = [states[row_mask][drop:] for states, row_mask in zip(hidden, mask.bool())]
        length = max(len(states) for states in kept)
        embeddings = torch.stack([torch.cat([s, s.new_zeros(length - len(s), s.shape[1])]) for s in kept])
        embeddings_mask = torch.stack([torch.arange(length, device=pipe.device) < len(s) for s in kept]).long()
        embeddings, embeddings_mask = embeddings[:, :limit], embeddings_mask[:, :limit]
        return {"prompt_emb": embeddings.to(pipe.torch_dtype),
                "prompt_emb_mask": None if bool(embeddings_mask.all()) else embeddings_mask}


class QwenImagePipeline(TextToLatentPipeline):
    """Qwen-Image generation and the computation its training shares.

    Build it with ``from_pretrained``; call it with a prompt to get an image. ``model_fn`` is also what training
    calls, on the state the units produce.
    """

    model_roles = MODEL_ROLES
    default_tokenizer_config = ModelConfig(model_id="Qwen/Qwen-Image", origin_file_pattern="tokenizer/")
    default_lora_target_modules = ("to_q,to_k,to_v,add_q_proj,add_k_proj,add_v_proj,to_out.0,to_add_out,img_mlp.net.2,"
                                   "img_mod.1,txt_mlp.net.2,txt_mod.1")
    model_fn_params = ("prompt_emb", "prompt_emb_mask", "context_latents", "edit_latents", "layer_input_latents")
    #: Extra inputs that must hold loaded images (a dataset column feeding one belongs in ``--data_file_keys``).
    image_inputs = ("edit_image", "layer_input_image", "context_image")
    #: Qwen-Image-Layered decomposes RGBA images: its dataset keeps their transparency.
    alpha_inputs = ("layer_input_image",)
    media_inputs = ("layer_num",)
    input_types = {**TextToLatentPipeline.input_types, "layer_num": non_negative_integer}
    load_options = ("processor_config", "zero_cond_t")
    #: A batch pads prompt embeddings to its longest prompt, marking real tokens in ``encoder_hidden_states_mask``.
    padded_inputs = {"prompt_emb": "prompt_emb_mask"}
    scheduler_preset = "qwen_image"
    #: Pixel area each edit image is resized to for the VAE (and for Qwen-Image-Edit's encoder), and the area
    #: Edit-2509 / 2511 show the encoder; diffusers' values, which the models were trained at.
    edit_image_pixels = EDIT_IMAGE_PIXELS
    edit_condition_pixels = EDIT_CONDITION_PIXELS
    #: The Qwen2.5-VL processor that reads edit images, and its folder; loaded on first use if unset.
    extra_attributes = {"processor": None, "processor_config": None}
    # As ``common.image_units``, with Layered's noise, input images and layer input image (see ``layered.py``) and
    # the in-context control image (``context.py``).
    unit_classes = (ShapeCheckUnit, LayeredNoiseUnit, LayeredInputImageUnit, EditImageEmbedderUnit,
                    LayerInputImageUnit, ContextImageUnit, LatentsUnit, PromptEmbedderUnit)

    def _after_load(self, processor_config: ModelConfig | None = None, zero_cond_t: bool | None = None) -> None:
        """What editing needs, after the models: the processor and Edit-2511's switch.

        Args:
            processor_config: The Qwen2.5-VL processor folder (``--processor_path``), loaded now. Unset: the
                ``processor/`` folder of the transformer's repository (see
                ``qwen_image_edit.default_processor_config``), loaded now when it is on disk, else downloaded on the
                first edit.
            zero_cond_t: Edit-2511's ``zero_cond_t`` (``--zero_cond_t``); ``None`` keeps the transformer config's.

        Raises:
            ModelLoadError: The processor folder holds no readable processor.
        """
        if processor_config is not None:
            self.processor_config, self.processor = processor_config, load_processor(processor_config)
        else:
            self.processor_config = default_processor_config(self.model_configs.get("dit"))
            self.processor = processor_if_present(self.processor_config)
        if zero_cond_t is not None and self.dit is not None:
            set_zero_cond_t(self.dit, zero_cond_t)

    @classmethod
    def companion_configs(cls, model_configs: Sequence[ModelConfig], tokenizer_config: ModelConfig | None = None,
                          inputs: Sequence[str] = (), processor_config: ModelConfig | None = None,
                          zero_cond_t: bool | None = None) -> list[ModelConfig]:
        """The tokenizer as in ``BasePipeline``, plus the default processor folder when ``inputs`` hold
        ``edit_image`` and no ``processor_config`` names one (``zero_cond_t`` needs no files)."""
        companions = super().companion_configs(model_configs, tokenizer_config)
        if "edit_image" in inputs and processor_config is None:
            dit = next((c for c in model_configs if model_class_name(c) == "QwenImageTransformer2DModel"), None)
            companions.append(default_processor_config(dit))
        return companions

    def edit_processor(self) -> Any:
        """The Qwen2.5-VL processor, loaded (and downloaded if missing) from ``processor_config`` on first use."""
        if self.processor is None:
            self.processor = load_processor(self.processor_config or default_processor_config(None))
        return self.processor

    def encode_image(self, image: Image.Image) -> torch.Tensor:
        """An image as normalised latents ``(1, 16, H/8, W/8)``: one frame through the 3D VAE (distribution mode); RGBA
        for Qwen-Image-Layered's four-channel VAE."""
        return encode_frames(self, [image])[:, :, 0]

    def training_media(self, sample: dict[str, Any]) -> dict[str, Any]:
        """As ``TextToLatentPipeline``'s; a Qwen-Image-Layered sample (with ``layer_num``) gives its whole ``image``
        list, the composite then the layers, as ``input_image``."""
        image = sample["image"]
        if sample.get("layer_num") is None:
            return super().training_media(sample)
        if not isinstance(image, list) or len(image) != sample["layer_num"] + 1:
            count = len(image) if isinstance(image, list) else "one image"
            raise ValueError(f"a Qwen-Image-Layered sample with layer_num={sample['layer_num']} needs an image list of "
                             f"{sample['layer_num'] + 1} (the composite, then each layer), not {count}; fix the "
                             "row's image cell or its layer_num")
        return {"input_image": image, "height": image[0].height, "width": image[0].width}

    def set_inference_timesteps(self, num_inference_steps: int, denoising_strength: float = 1.0, *,
                                latent_shape: tuple[int, ...]) -> None:
        """Qwen-Image's shift grows with the token count, ``(latent height / 2) * (latent width / 2)``."""
        image_seq_len = (latent_shape[-2] // 2) * (latent_shape[-1] // 2)
        self.scheduler.set_timesteps(num_inference_steps, denoising_strength, image_seq_len=image_seq_len)

    def model_fn(self, latents: torch.Tensor, timestep: torch.Tensor | float, prompt_emb: torch.Tensor,
                 prompt_emb_mask: torch.Tensor | None = None, context_latents: torch.Tensor | None = None,
                 edit_latents: Sequence[torch.Tensor] | None = None, layer_input_latents: torch.Tensor | None = None,
                 **_: Any) -> torch.Tensor:
        """The transformer's velocity prediction for unpacked ``latents`` at ``timestep`` (scale 0 to 1000).

        ``latents`` are ``(B, 16, h, w)``, or ``(B, 16, frames, h, w)`` for Qwen-Image-Layered (packed frame after
        frame, one ``img_shapes`` entry each). ``context_latents`` (an in-context control image), ``edit_latents``
        (reference images) and ``layer_input_latents`` (the image to decompose) are packed after the latents, in this
        order (the reference's), each with its own ``img_shapes`` entry; the prediction keeps only the latents'
        tokens. Extra state keys are accepted and ignored, since the loop passes the whole state.
        """
        batch, height, width = latents.shape[0], latents.shape[-2], latents.shape[-1]
        frames = latents.shape[2] if latents.dim() == 5 else 1
        timestep = torch.as_tensor(timestep, device=latents.device).to(latents.dtype).reshape(-1).expand(batch)
        tokens = [pack_frames(latents) if latents.dim() == 5 else pack_latents(latents)]
        shapes = [(1, height // 2, width // 2)] * frames
        conditions = [*(() if context_latents is None else (context_latents,)), *(edit_latents or ()),
                      *(() if layer_input_latents is None else (layer_input_latents,))]
        for reference in conditions:
            tokens.append(pack_latents(reference.to(latents.dtype)).expand(batch, -1, -1))
            shapes.append((1, reference.shape[-2] // 2, reference.shape[-1] // 2))
        # Layered's transformer takes an extra timestep condition, 0 for the RGBA decomposition.
        extra = {"additional_t_cond": torch.zeros(batch, dtype=torch.long, device=latents.device)} \
            if self.dit.config.get("use_additional_t_cond", False) else {}
        prediction = self.dit(hidden_states=torch.cat(tokens, dim=1), timestep=timestep / 1000,
                              encoder_hidden_states=prompt_emb, encoder_hidden_states_mask=prompt_emb_mask,
                              img_shapes=[shapes] * batch, return_dict=False, **extra)[0]
        prediction = prediction[:, :tokens[0].shape[1]]
        return unpack_frames(prediction, frames, height, width) if latents.dim() == 5 else \
            unpack_latents(prediction, height, width)

    def guide(self, positive: torch.Tensor, negative: torch.Tensor, cfg_scale: float) -> torch.Tensor:
        """CFG, rescaled so each packed token keeps the norm of the positive prediction (diffusers' rule); plain for
        Qwen-Image-Layered's frames, as diffusers' ``QwenImageLayeredPipeline`` does by default."""
        if positive.dim() == 5:
            return super().guide(positive, negative, cfg_scale)
        height, width = positive.shape[-2:]
        positive, negative = pack_latents(positive), pack_latents(negative)
        combined = negative + cfg_scale * (positive - negative)
        rescaled = combined * (torch.norm(positive, dim=-1, keepdim=True) / torch.norm(combined, dim=-1, keepdim=True))
        return unpack_latents(rescaled, height, width)

    def decode(self, inputs_shared: dict, inputs_posi: dict, inputs_nega: dict) -> torch.Tensor:
        """The final latents through the VAE, as ``(B, 3, H, W)`` values in ``[0, 1]``."""
        self.load_models_to_device(["vae"])
        if inputs_shared["latents"].dim() == 5:
            return decode_frames(self, inputs_shared["latents"])
        latents = inputs_shared["latents"].unsqueeze(2).to(self.vae.dtype)
        mean, inverse_std = self.latent_statistics(latents)
        images = self.vae.decode(latents / inverse_std + mean, return_dict=False)[0][:, :, 0]
        return (images / 2 + 0.5).clamp(0, 1)

    def sample_input_problems(self, inputs: set[str]) -> list[str]:
        """Qwen-Image renders from a prompt and, for editing, ``edit_image``; a first frame is for Wan."""
        return ['"input_image" is for Wan image-to-video; Qwen-Image-Edit takes "edit_image"'] \
            if "input_image" in inputs else []

    @torch.no_grad()
    def __call__(self, prompt: str, negative_prompt: str = "", cfg_scale: float = 4.0,
                 input_image: Image.Image | None = None, denoising_strength: float = 1.0,
                 edit_image: Image.Image | Sequence[Image.Image] | None = None,
                 layer_input_image: Image.Image | None = None, layer_num: int | None = None,
                 context_image: Image.Image | None = None, height: int | None = None, width: int | None = None,
                 seed: int | None = None, rand_device: str = "cpu", num_inference_steps: int = 30, max_sequence_length: int = 512,
                 output_type: str = "pil", progress_bar: bool = True) -> Image.Image | list[Image.Image] | torch.Tensor:
        """Generates one image, or with ``layer_input_image`` its decomposition into layers.

        Args:
            prompt: What to draw, or (with ``edit_image``) how to change the edit images.
            negative_prompt: What to steer away from; used when ``cfg_scale`` is not 1.
            cfg_scale: Classifier-free guidance scale; 1 turns CFG off and halves the work per step.
            input_image: Start from this image instead of pure noise (image-to-image).
            denoising_strength: With ``input_image``: how much of the schedule to run (1 ignores the image).
            edit_image: The image to edit (Qwen-Image-Edit), or a list of images, even of one (Edit-2509 / 2511); see
                ``edit.py``.
            layer_input_image: Qwen-Image-Layered: the RGBA image to decompose (see ``layered.py``).
            layer_num: Qwen-Image-Layered: the number of layers; the output is a list of ``layer_num + 1`` RGBA
                images, the composite first (a ``(layer_num + 1, 4, H, W)`` tensor for ``"pt"``).
                Qwen-Image-Layered-Control: 0, the one layer the prompt names.
            context_image: In-context control (Qwen-Image-In-Context-Control-Union, Qwen-Image-Layered-Control-V2,
                each a LoRA): a control image (pose, edges, depth, a mask) read at the output size (see
                ``context.py``).
            height: Output height in pixels, rounded to a multiple of 16. Unset: 1328, or with ``edit_image`` the
                height of the (last) edit image scaled to about 1024 x 1024 pixels, as diffusers does, or with
                ``layer_input_image`` its height scaled to about 640 x 640 pixels (diffusers' default bucket).
            width: Output width in pixels, rounded to a multiple of 16; unset as ``height``.
            seed: Noise seed; ``None`` draws from torch's global generator.
            rand_device: Device the noise is drawn on (CPU noise is the same on every machine).
            num_inference_steps: Denoising steps.
            max_sequence_length: Prompt tokens kept after the template (at most 1024); an edit prompt is not cut.
            output_type: ``"pil"`` for a PIL image, ``"pt"`` for a ``(1, 3, H, W)`` tensor in ``[0, 1]``.
            progress_bar: Show a progress bar over the steps.
        """
        check_call_inputs(prompt, output_type, max_sequence_length, TOKENIZER_MAX_LENGTH)
        check_layer_num(layer_num, layer_input_image)
        if context_image is not None and not isinstance(context_image, Image.Image):
            raise ValueError(f"context_image={context_image!r} must be a PIL image; open it first, e.g. "
                             "context_image=Image.open(path)")
        if layer_input_image is not None:
            default_width, default_height = edit_image_size(layer_input_image, LAYERED_DEFAULT_PIXELS)
        elif edit_image is not None:
            default_height, default_width = output_size(self, edit_image)
        else:
            default_height, default_width = DEFAULT_SIZE, DEFAULT_SIZE
        height, width = height or default_height, width or default_width
        if layer_input_image is None:
            self.set_inference_timesteps(num_inference_steps, denoising_strength,
                                         latent_shape=self.image_latent_shape(height, width))
        else:
            self.scheduler.set_timesteps(num_inference_steps, denoising_strength, mu=layered_mu(height, width))
        inputs_shared = {
            "cfg_scale": cfg_scale, "input_image": input_image, "denoising_strength": denoising_strength,
            "edit_image": edit_image, "layer_input_image": layer_input_image, "layer_num": layer_num,
            "context_image": context_image,
            "height": height, "width": width, "seed": seed, "rand_device": rand_device,
            "max_sequence_length": max_sequence_length,
        }  # fmt: skip
        images = self.denoise(inputs_shared, {"prompt": prompt}, {"negative_prompt": negative_prompt},
                              progress_bar=progress_bar)
        if layer_num is not None:
            return tensor_to_images(images) if output_type == "pil" else images
        return self.image_output(images, output_type)
