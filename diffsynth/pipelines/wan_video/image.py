"""Wan's image conditioning: the first frame (and optionally the last) as the transformer's ``y`` (Wan2.1 / Wan2.2
image-to-video, Fun InP, FLF2V), as the first latent frame (Wan2.2 TI2V-5B), and as CLIP features (Wan2.1
image-to-video).

Which one a model takes is read from its transformer (see ``WanVideoPipeline.image_conditioning``):

- ``"channels"``: ``in_channels`` above ``out_channels``. The transformer reads the noisy latents concatenated along
  channels with ``y``: a 4-channel first-frame mask and the normalised VAE latents of a video whose first frame is the
  image and whose other frames are zero, as diffusers' ``WanImageToVideoPipeline`` builds it. With ``end_image``
  (diffusers' ``last_image``) the video's last frame is that image and the mask marks it too (first-last-frame
  models: Wan2.1-FLF2V, the Fun InP models).
- ``"first_frame"``: the Wan2.2 latent space (48 channels). The image's normalised latents replace the first latent
  frame and that frame's tokens get timestep 0, as diffusers does with ``expand_timesteps`` (Wan2.2-TI2V-5B).
- CLIP features, besides ``y``, when the transformer has image cross-attention (``image_dim`` set): of the first
  image, or of both images when the transformer has learned positions for two images' tokens (``pos_embed_seq_len``,
  Wan2.1-FLF2V). The Fun InP models read the first image's features only, as the reference gives them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from PIL import Image

from ...core.loader import ModelConfig
from ...diffusion.base_pipeline import PipelineUnit
from ..common import image_to_tensor, load_preprocessor
from .units import normalised_latents

if TYPE_CHECKING:
    from .pipeline import WanVideoPipeline

# Channels of the first-frame mask in ``y``: one per pixel frame folded into a latent frame.
MASK_CHANNELS = 4


def check_image(input_image: Any, name: str = "input_image", frame: str = "the first frame") -> Image.Image:
    """``input_image`` if it is one PIL image, else a ``TypeError`` naming the input (``name``, ``frame``) and saying
    how to load one."""
    if not isinstance(input_image, Image.Image):
        raise TypeError(f"{name} must be one PIL image ({frame}), got {type(input_image).__name__}; "
                        "load it with PIL.Image.open(path)")
    return input_image


def condition_mask(num_frames: int, with_end: bool, latent_shape: tuple[int, ...]) -> torch.Tensor:
    """The ``MASK_CHANNELS`` mask of ``y``: ones on the given pixel frames (the first, and the last ``with_end``),
    folded into latent frames as diffusers does (the first frame repeated ``MASK_CHANNELS`` times, then every
    ``MASK_CHANNELS`` pixel frames one latent frame, one channel each)."""
    given = torch.zeros(num_frames)
    given[0] = 1
    if with_end:
        given[-1] = 1
    folded = torch.cat([given[:1].repeat(MASK_CHANNELS), given[1:]]).view(-1, MASK_CHANNELS).T
    return folded.reshape(1, MASK_CHANNELS, -1, 1, 1).expand(1, MASK_CHANNELS, *latent_shape[2:])


def resized(image: Image.Image, height: int, width: int) -> Image.Image:
    """``image`` in RGB at ``width x height`` (LANCZOS, diffusers' ``VideoProcessor`` default)."""
    image = image.convert("RGB")
    return image if image.size == (width, height) else image.resize((width, height), Image.Resampling.LANCZOS)


class ImageConditionUnit(PipelineUnit):
    """Encodes ``input_image`` (and ``end_image``) with the VAE into the condition the transformer takes: ``y`` or
    ``first_frame_latents`` (see the module docstring); both are ``None`` without an image or for a model that takes
    neither.

    This is also where a mismatch between the inputs and the transformer is reported, before any encoder runs.
    """

    def __init__(self) -> None:
        super().__init__(input_params=("input_image", "end_image", "height", "width", "num_frames"),
                         output_params=("y", "first_frame_latents"), onload_model_names=("vae",))

    def process(self, pipe: WanVideoPipeline, input_image: Image.Image | None, end_image: Image.Image | None,
                height: int, width: int, num_frames: int) -> dict:
        mode = pipe.image_conditioning()
        if end_image is not None:
            check_image(end_image, "end_image", "the last frame")
            if input_image is None or mode != "channels":
                raise ValueError(f"end_image was given, but {pipe.describe_transformer()} "
                                 f"{'takes no last frame' if mode != 'channels' else 'needs input_image with it'}; "
                                 "end_image goes with input_image to an image-to-video Wan (e.g. "
                                 "Wan-AI/Wan2.1-FLF2V-14B-720P, PAI/Wan2.1-Fun-1.3B-InP), or drop it")
        if input_image is None:
            # Without a loaded transformer (a stage that leaves it out) there is nothing to check against.
            if pipe.dit is not None and pipe.needs_input_image():
                raise ValueError(f"{pipe.describe_transformer()} is an image-to-video model and needs the first "
                                 "frame: pass input_image=<PIL image>, or load a text-to-video Wan transformer")
            return {"y": None, "first_frame_latents": None}
        check_image(input_image)
        if mode == "animate":  # the character image goes into Animate's own condition (animate.py)
            return {"y": None, "first_frame_latents": None}
        if mode is None:
            # Dropping the image silently would return a video unrelated to it.
            raise ValueError(f"input_image was given, but {pipe.describe_transformer()} takes no image (a "
                             "text-to-video model); load an image-to-video Wan (e.g. "
                             "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers), or drop input_image (to start from existing "
                             "frames, pass input_video)")
        first = image_to_tensor(resized(input_image, height, width))
        if mode == "first_frame":
            latents = normalised_latents(pipe, first.unsqueeze(2))
            return {"y": None, "first_frame_latents": latents.to(pipe.torch_dtype)}
        video = torch.zeros(1, 3, num_frames, height, width)
        video[:, :, 0] = first[0]
        if end_image is not None:
            video[:, :, -1] = image_to_tensor(resized(end_image, height, width))[0]
        latents = normalised_latents(pipe, video)
        mask = condition_mask(num_frames, end_image is not None, latents.shape).to(latents)
        return {"y": torch.cat([mask, latents], dim=1).to(pipe.torch_dtype), "first_frame_latents": None}


class ImageEmbedderUnit(PipelineUnit):
    """Encodes ``input_image`` with the CLIP vision encoder into ``clip_feature`` (its penultimate hidden states),
    ``(1, tokens, width)``; for a transformer with positions for two images (FLF2V) the tokens of ``end_image``
    follow, ``(1, 2 * tokens, width)``, as the reference lays them out.

    The images go to the CLIP processor as given (it resizes and crops on its own). ``clip_feature`` is ``None``
    without an image or when the transformer has no image cross-attention (``image_dim`` unset). It is shared state:
    diffusers gives both CFG branches the same image embeddings.
    """

    def __init__(self) -> None:
        super().__init__(input_params=("input_image", "end_image"), output_params=("clip_feature",),
                         onload_model_names=("image_encoder",))

    def process(self, pipe: WanVideoPipeline, input_image: Image.Image | None,
                end_image: Image.Image | None) -> dict:
        if input_image is None or not pipe.takes_image_embedding():
            return {"clip_feature": None}
        check_image(input_image)
        images = [input_image]
        if pipe.takes_two_images():
            if end_image is None:
                raise ValueError(f"{pipe.describe_transformer()} is a first-last-frame model (Wan2.1-FLF2V): its "
                                 "image cross-attention reads two images; pass end_image=<PIL image> (the last "
                                 "frame) with input_image")
            images.append(check_image(end_image, "end_image", "the last frame"))
        if pipe.image_encoder is None:
            raise ValueError("this transformer reads CLIP image features (image_dim="
                             f"{pipe.dit.config.image_dim}), so input_image needs the image encoder; add "
                             "'<model_id>:image_encoder/model*.safetensors' (diffusers layout) or "
                             "'<model_id>:models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth' (original layout) "
                             "to the model configs")
        if pipe.image_processor is None:
            raise ValueError("encoding input_image needs the CLIP image processor; load the pipeline with "
                             "from_pretrained from a repository that has image_processor/, or pass "
                             "image_processor_config=ModelConfig(...) naming that folder")
        pixels = pipe.image_processor(images=images, return_tensors="pt").pixel_values
        hidden = pipe.image_encoder(pixel_values=pixels.to(pipe.device, pipe.image_encoder.dtype),
                                    output_hidden_states=True).hidden_states[-2]
        # The images' tokens one after the other, as one sample: the layout the reference's FLF2V DiT reads.
        return {"clip_feature": hidden.reshape(1, -1, hidden.shape[-1]).to(pipe.torch_dtype)}


def is_original_layout(config: ModelConfig) -> bool:
    """Whether a config names an original Wan release file (``.pth``) rather than a diffusers / transformers folder;
    told from the name alone, so no file is opened."""
    names = [config.origin_file_pattern] if config.model_id is not None else (
        [config.path] if isinstance(config.path, str) else list(config.path))
    return any(str(name).endswith(".pth") for name in names)


def clip_image_processor(image_encoder: torch.nn.Module) -> Any:
    """The CLIP preprocessing the Wan2.1 image-to-video repositories ship, at the encoder's image size; for the
    original layout, whose CLIP file comes without a processor."""
    from transformers import CLIPImageProcessor

    from .original_encoders import clip_image_processor_config

    config = clip_image_processor_config(image_encoder.config.image_size)
    config.pop("image_processor_type")
    return CLIPImageProcessor(**config)


def load_image_processor(config: ModelConfig) -> Any:
    """Resolves an image-processor folder (e.g. pattern ``"image_processor/"``) and loads its ``CLIPImageProcessor``.

    Raises:
        ModelLoadError: The folder holds no ``preprocessor_config.json``, or transformers cannot read it.
    """
    from transformers import CLIPImageProcessor

    return load_preprocessor(config, CLIPImageProcessor.from_pretrained,
                             "point it at the repository's image_processor/ folder", "the image processor",
                             "restore the repository's preprocessor_config.json")
