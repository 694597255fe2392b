"""Z-Image-Omni-Base: what its SigLIP conditioning and condition images (``edit_image``) add to the Z-Image pipeline.

The behaviour is diffusers' ``ZImageOmniPipeline``. An Omni transformer is one whose config sets ``siglip_feat_dim``
(it then holds a SigLIP embedder and refiner); it always runs in diffusers' "omni mode", with or without images:

- The prompt is not put through the chat template: it is cut into segments around the condition images,
  ``<|im_start|>user\\n<|vision_start|>``, one ``<|vision_end|><|vision_start|>`` between images,
  ``<|vision_end|>{prompt}<|im_end|>\\n<|im_start|>assistant\\n<|vision_start|>`` and ``<|vision_end|><|im_end|>``
  (without images the single ``<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n``). Each segment is
  encoded alone and keeps its real tokens; the state holds them concatenated (``prompt_emb``) with the token count of
  each segment (``prompt_emb_lengths``), so that a batch can still pad ``prompt_emb`` like Z-Image's.
- Each condition image is checked (``common.image_list``) and shrunk as FLUX.2's reference images are (over
  1024 x 1024 pixels it is resized, Lanczos, to the output's area when height and width are given, else to 1024 x
  1024); the VAE reads it centre-cropped to sides that are multiples of 16 (normalised latents, the distribution's
  mode), SigLIP2 reads it uncropped through the ``Siglip2ImageProcessor`` (its patch grid of last hidden states).
- The transformer reads, per sample, the condition latents then the noisy latents (noise mask 0 for the conditions,
  1 for the target), the caption segments, and the SigLIP grids followed by an empty slot for the target; only the
  target's prediction is kept.

The processor lives in the ``siglip_processor/`` folder of the Omni-Base repository, beside ``siglip/``. diffusers
encodes condition images with the VAE in bfloat16 (it casts the pixels), so its image path runs only with a bfloat16
VAE; here the pixels take the VAE's own dtype.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from PIL import Image

from ...core.loader import ModelConfig
from ...diffusion.base_pipeline import PipelineUnit
from ..common import image_list, load_if_on_disk, load_preprocessor, sibling_folder

if TYPE_CHECKING:
    from .pipeline import ZImagePipeline

# diffusers shrinks a condition image above this many pixels before both encoders read it.
CONDITION_MAX_PIXELS = 1024 * 1024
# Condition images are cropped to multiples of this for the VAE (8x compression times the 2x2 patch).
CONDITION_MULTIPLE = 16


def is_omni(dit: torch.nn.Module | None) -> bool:
    """Whether ``dit`` is an Omni transformer (``siglip_feat_dim`` set: it has a SigLIP embedder)."""
    return dit is not None and getattr(dit, "siglip_embedder", None) is not None


def prompt_segments(prompt: str, num_images: int) -> list[str]:
    """The caption segments diffusers' ``ZImageOmniPipeline`` encodes for ``prompt`` with ``num_images`` images."""
    if num_images == 0:
        return [f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"]
    return [
        "<|im_start|>user\n<|vision_start|>",
        *["<|vision_end|><|vision_start|>"] * (num_images - 1),
        f"<|vision_end|>{prompt}<|im_end|>\n<|im_start|>assistant\n<|vision_start|>",
        "<|vision_end|><|im_end|>",
    ]


def encode_omni_prompt(pipe: ZImagePipeline, prompt: str, num_images: int, max_length: int,
                       hidden_layer: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(prompt_emb, prompt_emb_lengths)``: the segments' hidden states of layer ``hidden_layer``, concatenated
    ``(1, L, D)``, and each segment's token count ``(1, S)`` (None for one segment, which needs no split).

    Each segment is cut to ``max_length`` tokens, as diffusers cuts it; it is encoded without padding, which changes
    no real token of the causal encoder.
    """
    embeddings = []
    for segment in prompt_segments(prompt, num_images):
        tokens = pipe.tokenizer([segment], max_length=max_length, truncation=True, return_tensors="pt").to(pipe.device)
        hidden = pipe.text_encoder(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask.bool(),
                                   output_hidden_states=True).hidden_states[hidden_layer]
        embeddings.append(hidden.to(pipe.torch_dtype))
    lengths = None
    if len(embeddings) > 1:
        lengths = torch.tensor([[emb.shape[1] for emb in embeddings]], dtype=torch.long, device=pipe.device)
    return torch.cat(embeddings, dim=1), lengths


def condition_images(edit_image: Image.Image | Sequence[Image.Image],
                     target_area: int | None) -> list[tuple[Image.Image, Image.Image]]:
    """Each condition image as ``(for SigLIP, for the VAE)``: shrunk (Lanczos) to ``target_area`` pixels (default
    1024 x 1024) when above 1024 x 1024, and that centre-cropped to sides that are multiples of 16.

    Raises:
        ValueError: As ``common.image_list`` (a path instead of an image, an empty list, not images).
    """
    prepared = []
    for image in image_list(edit_image)[0]:
        image = image.convert("RGB")
        width, height = image.size
        if width * height > CONDITION_MAX_PIXELS:
            scale = math.sqrt((target_area or CONDITION_MAX_PIXELS) / (width * height))
            image = image.resize((int(width * scale), int(height * scale)), Image.Resampling.LANCZOS)
            width, height = image.size
        crop_width = width // CONDITION_MULTIPLE * CONDITION_MULTIPLE
        crop_height = height // CONDITION_MULTIPLE * CONDITION_MULTIPLE
        left, top = (width - crop_width) // 2, (height - crop_height) // 2
        prepared.append((image, image.crop((left, top, left + crop_width, top + crop_height))))
    return prepared


def output_size(edit_image: Image.Image | Sequence[Image.Image]) -> tuple[int, int]:
    """diffusers' default ``(height, width)`` with condition images: the last one's, as the VAE reads it."""
    _, cropped = condition_images(edit_image, None)[-1]
    return cropped.height, cropped.width


def condition_pixels(image: Image.Image) -> torch.Tensor:
    """An RGB image as ``(1, 3, H, W)`` values in ``[-1, 1]``, laid out as diffusers' image processor lays it out
    (channels last, batch stride ``H * W * 3``): a bfloat16 VAE's CPU convolutions round by memory layout, so only
    this layout reproduces diffusers' condition latents exactly."""
    array = np.asarray(image.convert("RGB"), dtype=np.float32)[None] / 255.0
    return torch.from_numpy(array).permute(0, 3, 1, 2) * 2.0 - 1.0


def siglip_grid(pipe: ZImagePipeline, image: Image.Image) -> torch.Tensor:
    """SigLIP2's last hidden states of ``image`` as its ``(1, rows, columns, C)`` patch grid (padding dropped)."""
    inputs = pipe.omni_siglip_processor()(images=[image], return_tensors="pt").to(pipe.device)
    rows, columns = (int(side) for side in inputs["spatial_shapes"][0])
    pixel_values = inputs["pixel_values"].to(pipe.siglip.dtype)
    hidden = pipe.siglip(pixel_values=pixel_values, pixel_attention_mask=inputs["pixel_attention_mask"],
                         spatial_shapes=inputs["spatial_shapes"]).last_hidden_state
    return hidden[:, :rows * columns].reshape(1, rows, columns, -1).to(pipe.torch_dtype)


class OmniConditionEmbedderUnit(PipelineUnit):
    """Encodes each condition image (``edit_image``) for Z-Image-Omni-Base: normalised VAE latents and SigLIP2 grids.

    Outputs ``edit_latents`` (a list of ``(1, 16, h / 8, w / 8)`` tensors) and ``edit_siglip`` (a list of
    ``(1, rows, columns, C)`` tensors), both ``None`` without condition images. Shrinking an image above 1024 x 1024
    pixels aims at the output's area, as diffusers does when height and width are given.
    """

    def __init__(self) -> None:
        super().__init__(input_params=("edit_image", "height", "width"), output_params=("edit_latents", "edit_siglip"),
                         onload_model_names=("vae", "siglip"))

    def process(self, pipe: ZImagePipeline, edit_image: Image.Image | Sequence[Image.Image] | None,
                height: int | None, width: int | None) -> dict:
        if edit_image is None:
            return {"edit_latents": None, "edit_siglip": None}
        if not is_omni(pipe.dit) or pipe.siglip is None:
            raise ValueError("edit_image needs Z-Image-Omni-Base's transformer and SigLIP model; add "
                             "'Tongyi-MAI/Z-Image-Omni-Base:transformer/*.safetensors' and "
                             "'Tongyi-MAI/Z-Image-Omni-Base:siglip/model.safetensors' to the model configs")
        target_area = height * width if height and width else None
        latents, grids = [], []
        for resized, cropped in condition_images(edit_image, target_area):
            pixels = condition_pixels(cropped).to(pipe.device, pipe.vae.dtype)
            encoded = pipe.vae.encode(pixels).latent_dist.mode()
            latents.append(pipe.normalise_latents(encoded).to(pipe.torch_dtype))
            grids.append(siglip_grid(pipe, resized))
        return {"edit_latents": latents, "edit_siglip": grids}


def omni_model_fn(pipe: ZImagePipeline, latents: torch.Tensor, timestep: torch.Tensor, prompt_emb: torch.Tensor,
                  prompt_emb_mask: torch.Tensor | None, prompt_emb_lengths: torch.Tensor | None,
                  edit_latents: Sequence[torch.Tensor] | None,
                  edit_siglip: Sequence[torch.Tensor] | None) -> torch.Tensor:
    """The Omni transformer's velocity for ``(B, 16, h, w)`` ``latents``; ``timestep`` is ``(B,)`` on 0 to 1000.

    Per sample: the caption's real tokens split into their segments, the condition latents before the noisy ones
    (noise mask 0, then 1), the SigLIP grids and an empty slot for the target; the prediction is negated.
    """
    batch = latents.shape[0]
    embeddings = prompt_emb.expand(batch, -1, -1) if prompt_emb.shape[0] == 1 else prompt_emb
    x, captions, siglip, noise_masks = [], [], [], []
    for index in range(batch):
        caption = embeddings[index] if prompt_emb_mask is None else embeddings[index][prompt_emb_mask[index].bool()]
        if prompt_emb_lengths is None:
            captions.append([caption])
        else:
            lengths = prompt_emb_lengths[min(index, prompt_emb_lengths.shape[0] - 1)].tolist()
            captions.append(list(caption.split(lengths)))
        conditions = [edit[min(index, edit.shape[0] - 1)].unsqueeze(1).to(latents.dtype) for edit in edit_latents or ()]
        x.append([*conditions, latents[index].unsqueeze(1)])
        noise_masks.append([0] * len(conditions) + [1])
        grids = [grid[min(index, grid.shape[0] - 1)].to(latents.dtype) for grid in edit_siglip or ()]
        siglip.append([*grids, None] if grids else None)
    prediction = pipe.dit(x=x, t=(1000 - timestep) / 1000, cap_feats=captions, siglip_feats=siglip,
                          image_noise_mask=noise_masks, return_dict=False)[0]
    return -torch.stack(prediction).squeeze(2)


def default_siglip_processor_config(siglip_config: ModelConfig | None) -> ModelConfig | None:
    """Where the SigLIP2 image processor comes from: the ``siglip_processor/`` folder of the SigLIP model's
    repository (for local files, the ``siglip_processor`` folder beside the model's folder); None without one."""
    return None if siglip_config is None else sibling_folder(siglip_config, "siglip_processor")


def siglip_processor_if_present(config: ModelConfig | None) -> Any:
    """The processor ``config`` names when its files are on disk already, else None (nothing is downloaded)."""
    return load_if_on_disk(config, load_siglip_processor)


def load_siglip_processor(config: ModelConfig) -> Any:
    """Resolves a ``siglip_processor/`` folder (downloading it when missing) and loads its ``Siglip2ImageProcessor``.

    Raises:
        ModelLoadError: The folder holds no ``preprocessor_config.json``, or transformers cannot read it.
    """
    from transformers import Siglip2ImageProcessor

    return load_preprocessor(config, Siglip2ImageProcessor.from_pretrained,
                             "the Z-Image-Omni-Base repository's siglip_processor/ folder holds it",
                             "the SigLIP2 image processor", "restore the repository's siglip_processor/ folder")
