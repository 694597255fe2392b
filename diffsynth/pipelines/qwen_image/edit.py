"""Qwen-Image-Edit, Edit-2509 and Edit-2511: what the edit images add to the Qwen-Image pipeline.

The behaviour is diffusers' ``QwenImageEditPipeline`` (one edit image) and ``QwenImageEditPlusPipeline`` (several):

- The prompt is encoded by Qwen2.5-VL together with the edit images, through the Qwen2.5-VL processor and the
  version's chat template, whose first 64 tokens (the system turn) are dropped from the output. Edit's template holds
  one image; Edit-2509's names each image ``Picture 1:``, ``Picture 2:``... before the prompt. Edit shows the encoder
  the image as resized for the VAE; 2509 resizes each image to about 384 x 384 pixels for it.
- Each edit image, resized to about 1024 x 1024 pixels (its own aspect ratio, sides multiples of 32), is encoded by
  the VAE into normalised reference latents. The transformer reads their tokens after those of the image being
  generated, with one ``img_shapes`` entry each, and its prediction for them is dropped: they only condition it, and
  the training loss covers the generated image's tokens alone.
- Edit-2511's ``zero_cond_t`` (the reference-image tokens are modulated as at timestep 0) is a switch of diffusers'
  transformer, set by its ``config.json``; ``set_zero_cond_t`` turns it on where a config lacks it.

As in the reference implementation, the form of ``edit_image`` picks the template: a single PIL image is encoded the
Qwen-Image-Edit way, a list (even of one image) the Edit-2509 / 2511 way. A dataset gives a list for a JSON list cell
or a CSV cell naming several files.

The processor lives in the ``processor/`` folder of the Edit repositories. Recent transformers build its video part
only with torchvision installed; without it the processor is built from its image processor and tokenizer alone,
which is all that editing uses.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from PIL import Image

from ...core.loader import ModelConfig
from ...diffusion.base_pipeline import PipelineUnit
from ..common import image_list, image_to_tensor, load_if_on_disk, load_preprocessor, sibling_folder

if TYPE_CHECKING:
    from .pipeline import QwenImagePipeline

# Chat templates of Qwen-Image-Edit (one image inside the user turn) and Edit-2509 (pictures listed before the prompt).
EDIT_SYSTEM_PROMPT = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
    "background), then explain how the user's text instruction should alter or modify the image. Generate a new "
    "image that meets the user's requirements while maintaining consistency with the original input where "
    "appropriate.<|im_end|>\n"
)
EDIT_PROMPT_TEMPLATE = (
    EDIT_SYSTEM_PROMPT + "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{}<|im_end|>\n"
    "<|im_start|>assistant\n"
)
EDIT_PLUS_PROMPT_TEMPLATE = EDIT_SYSTEM_PROMPT + "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
EDIT_PLUS_PICTURE_TEMPLATE = "Picture {}: <|vision_start|><|image_pad|><|vision_end|>"
EDIT_TEMPLATE_DROP_TOKENS = 64
# Pixel areas the edit images are resized to: for the VAE (and, for Edit, the encoder), and for 2509's encoder.
EDIT_IMAGE_PIXELS = 1024 * 1024
EDIT_CONDITION_PIXELS = 384 * 384
# Where the reference trainer takes the processor from when nothing names one.
DEFAULT_PROCESSOR_CONFIG = ModelConfig(model_id="Qwen/Qwen-Image-Edit", origin_file_pattern="processor/")


def edit_image_size(image: Image.Image, pixels: int) -> tuple[int, int]:
    """The ``(width, height)`` of about ``pixels`` pixels with ``image``'s aspect ratio, sides rounded to 32."""
    ratio = image.width / image.height
    width = math.sqrt(pixels * ratio)
    return round(width / 32) * 32, round(width / ratio / 32) * 32


def resize_edit_image(image: Image.Image, pixels: int) -> Image.Image:
    """``image`` in RGB at ``edit_image_size`` (Lanczos, as diffusers' image processor resizes)."""
    image = image.convert("RGB")
    size = edit_image_size(image, pixels)
    return image if image.size == size else image.resize(size, Image.Resampling.LANCZOS)


def edit_image_list(edit_image: Image.Image | Sequence[Image.Image]) -> tuple[list[Image.Image], bool]:
    """The edit images as a list, and whether they came as a list (the Edit-2509 / 2511 behaviour); see
    ``common.image_list`` for what is refused."""
    return image_list(edit_image)


def output_size(pipe: QwenImagePipeline, edit_image: Image.Image | Sequence[Image.Image]) -> tuple[int, int]:
    """diffusers' default ``(height, width)`` for an edit: the size of the (last) edit image resized for the VAE."""
    images, _ = edit_image_list(edit_image)
    width, height = edit_image_size(images[-1], pipe.edit_image_pixels)
    return height, width


class EditImageEmbedderUnit(PipelineUnit):
    """Encodes each edit image, resized to about ``pipe.edit_image_pixels``, into normalised reference latents.

    Outputs ``edit_latents``, a list of ``(1, 16, h / 8, w / 8)`` tensors (one per image, sizes may differ), or
    ``None`` without edit images. The VAE's distribution mode is used, as diffusers does.
    """

    def __init__(self) -> None:
        super().__init__(input_params=("edit_image",), output_params=("edit_latents",), onload_model_names=("vae",))

    def process(self, pipe: QwenImagePipeline, edit_image: Image.Image | Sequence[Image.Image] | None) -> dict:
        if edit_image is None:
            return {"edit_latents": None}
        latents = []
        for image in edit_image_list(edit_image)[0]:
            pixels = image_to_tensor(resize_edit_image(image, pipe.edit_image_pixels))
            encoded = pipe.vae.encode(pixels.to(pipe.device, pipe.vae.dtype).unsqueeze(2)).latent_dist.mode()[:, :, 0]
            mean, inverse_std = pipe.latent_statistics(encoded)
            latents.append(((encoded - mean) * inverse_std).to(pipe.torch_dtype))
        return {"edit_latents": latents}


def encode_edit_prompt(pipe: QwenImagePipeline, prompt: str,
                       edit_image: Image.Image | Sequence[Image.Image]) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen2.5-VL's last hidden states and attention mask for ``prompt`` with the edit images, template included.

    The caller drops the template's first ``EDIT_TEMPLATE_DROP_TOKENS`` tokens; nothing is truncated, since the image
    tokens alone may outnumber the text-to-image prompt limit (diffusers does not truncate either).
    """
    images, several = edit_image_list(edit_image)
    if several:
        pictures = "".join(EDIT_PLUS_PICTURE_TEMPLATE.format(index) for index in range(1, len(images) + 1))
        text = EDIT_PLUS_PROMPT_TEMPLATE.format(pictures + prompt)
        images = [resize_edit_image(image, pipe.edit_condition_pixels) for image in images]
    else:
        text = EDIT_PROMPT_TEMPLATE.format(prompt)
        images = [resize_edit_image(images[0], pipe.edit_image_pixels)]
    inputs = pipe.edit_processor()(text=[text], images=images, padding=True, return_tensors="pt").to(pipe.device)
    output = pipe.text_encoder(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                               pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"],
                               output_hidden_states=True)
    return output.hidden_states[-1], inputs["attention_mask"]


def set_zero_cond_t(dit: torch.nn.Module, enabled: bool) -> None:
    """Turns Edit-2511's ``zero_cond_t`` on or off in a diffusers ``QwenImageTransformer2DModel``.

    It adds no weights: the transformer and each block read the flag at every call. The config is updated too, so
    that it (and a split-training cache made with it) says what the model computes.
    """
    dit.zero_cond_t = enabled
    for block in dit.transformer_blocks:
        block.zero_cond_t = enabled
    dit.register_to_config(zero_cond_t=enabled)


def default_processor_config(dit_config: ModelConfig | None) -> ModelConfig:
    """Where the processor comes from when nothing names it: the ``processor/`` folder of the transformer's
    repository (for local files, the ``processor`` folder beside the transformer's folder, when there is one), else
    the reference's default, ``Qwen/Qwen-Image-Edit:processor/``."""
    if dit_config is None:
        return DEFAULT_PROCESSOR_CONFIG
    return sibling_folder(dit_config, "processor") or DEFAULT_PROCESSOR_CONFIG


def processor_if_present(config: ModelConfig) -> Any:
    """The processor ``config`` names when its files are already on disk, else ``None`` (nothing is downloaded)."""
    return load_if_on_disk(config, load_processor)


def load_processor(config: ModelConfig) -> Any:
    """Resolves a processor folder (downloading it when missing) and loads the Qwen2.5-VL processor in it.

    Raises:
        ModelLoadError: The folder holds no ``preprocessor_config.json``, or transformers cannot read it.
    """
    from transformers import Qwen2VLProcessor
    from transformers.utils import is_torchvision_available

    processor_class = Qwen2VLProcessor if is_torchvision_available() else _image_text_processor_class()
    return load_preprocessor(config, processor_class.from_pretrained, "point --processor_path (processor_config) at "
                             "a Qwen-Image-Edit repository's processor/ folder", "the Qwen2.5-VL processor",
                             "restore the repository's processor/ folder")


@functools.cache
def _image_text_processor_class() -> type:
    """``Qwen2VLProcessor`` without its video processor, for machines without torchvision.

    transformers builds a processor's parts from its ``__init__`` arguments, so leaving ``video_processor`` out of
    the signature leaves it out of loading; text and images are processed by the inherited code unchanged.
    """
    from transformers import Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin

    class Qwen2VLImageTextProcessor(Qwen2VLProcessor):
        def __init__(self, image_processor: Any = None, tokenizer: Any = None, chat_template: str | None = None,
                     **kwargs: Any) -> None:
            self.image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
            self.video_token = getattr(tokenizer, "video_token", None) or "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template, **kwargs)

    return Qwen2VLImageTextProcessor
