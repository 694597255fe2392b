"""Pieces every pipeline family shares: size rounding, noise, image tensors and the starting-latents unit."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from ..core.data.cells import integer, positive_integer, real, text
from ..core.device import resolve_device
from ..core.files import atomic_write
from ..core.loader import ModelConfig, ModelLoadError, resolve_files
from ..diffusion.base_pipeline import BasePipeline, PipelineUnit
from ..diffusion.flow_match import FlowMatchScheduler
from .registry import scheduler_preset

logger = logging.getLogger(__name__)

# Pixels per latent token side: the VAEs downsample by 8 and the transformers patch 2x2 latents.
SIZE_MULTIPLE = 16


def round_size(value: int, multiple: int = SIZE_MULTIPLE) -> int:
    """``value`` rounded to the nearest multiple of ``multiple`` (halves up), at least ``multiple``."""
    return max(multiple, (int(value) + multiple // 2) // multiple * multiple)


def image_to_tensor(image: Image.Image) -> torch.Tensor:
    """An RGB PIL image as a ``(1, 3, H, W)`` float32 tensor in ``[-1, 1]``."""
    array = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(array).permute(2, 0, 1).unsqueeze(0) * 2.0 - 1.0


def tensor_to_images(images: torch.Tensor) -> list[Image.Image]:
    """``(B, 3, H, W)`` values in ``[0, 1]`` to PIL images, rounded like diffusers' ``numpy_to_pil``."""
    array = (images.permute(0, 2, 3, 1).float().cpu().numpy() * 255).round().astype("uint8")
    return [Image.fromarray(frame) for frame in array]


def image_list(images: Image.Image | Any, name: str = "edit_image") -> tuple[list[Image.Image], bool]:
    """Condition images (one PIL image or a list of them) as a list, and whether they came as a list; ``name`` is
    the input they were given as, for messages.

    Raises:
        ValueError: A path instead of an image (the dataset column was not loaded), an empty list, or not images.
    """
    several = isinstance(images, (list, tuple))
    found = list(images) if several else [images]
    if not found:
        raise ValueError(f"{name} is an empty list; give one image, or a list of them")
    for image in found:
        if isinstance(image, (str, Path)):
            raise ValueError(f"{name} holds the path {str(image)!r}, not an image; open it with PIL "
                             f"(Image.open), or when training add {name} to --data_file_keys (e.g. "
                             f"--data_file_keys image,{name}) so the dataset loads it")
        if not isinstance(image, Image.Image):
            raise ValueError(f"{name} holds a {type(image).__name__}; pass PIL images (one, or a list)")
    return found, several


def check_call_inputs(prompt: Any, output_type: str, max_sequence_length: int | None = None,
                      max_length: int = 0, output_types: tuple[str, ...] = ("pil", "pt")) -> None:
    """The checks every pipeline's ``__call__`` makes first: one prompt string, a known ``output_type``, and (when
    given) ``max_sequence_length`` in ``[1, max_length]``.

    Raises:
        TypeError: ``prompt`` is not one string.
        ValueError: Another ``output_type``, or a sequence length out of range.
    """
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be one string, got {type(prompt).__name__}; call once per prompt")
    if output_type not in output_types:
        shown = ", ".join(repr(name) for name in output_types[:-1]) + f" or {output_types[-1]!r}"
        raise ValueError(f"output_type={output_type!r} must be {shown}")
    if max_sequence_length is not None and not 1 <= max_sequence_length <= max_length:
        raise ValueError(f"max_sequence_length={max_sequence_length} must lie in [1, {max_length}]")


def draw_noise(pipe: BasePipeline, shape: tuple[int, ...], seed: int | None, rand_device: Any) -> torch.Tensor:
    """Gaussian noise of ``shape`` in the pipeline's dtype, drawn on ``rand_device`` (CPU noise is the same on every
    machine) from ``seed`` or torch's global generator, then moved to the compute device."""
    rand_device = resolve_device(rand_device or "cpu", "rand_device")
    generator = None if seed is None else torch.Generator(rand_device).manual_seed(seed)
    noise = torch.randn(shape, generator=generator, device=rand_device, dtype=pipe.torch_dtype)
    return noise.to(pipe.device)


def scheduler_from_preset(name: str, **overrides: Any) -> FlowMatchScheduler:
    """The flow-match schedule of a family's preset ``name`` (``FamilySpec.scheduler_presets``; case and ``-`` / ``_``
    ignored), with ``overrides``.

    Raises:
        ValueError: No family declares the preset.
    """
    return FlowMatchScheduler(**{**scheduler_preset(name.replace("-", "_")), **overrides})


class ShapeCheckUnit(PipelineUnit):
    """Rounds ``height`` and ``width`` to the nearest multiple of the pipeline's ``size_multiple()`` (16, or 32 for a
    16x-compressing VAE), warning when it changes them."""

    def __init__(self) -> None:
        super().__init__(input_params=("height", "width"), output_params=("height", "width"))

    def process(self, pipe: TextToLatentPipeline, height: int, width: int) -> dict:
        rounded = {}
        multiple = pipe.size_multiple()
        for name, value in (("height", height), ("width", width)):
            if not isinstance(value, (int, np.integer)) or value <= 0:
                raise ValueError(f"{name}={value!r} must be a positive number of pixels, e.g. {name}=1328")
            rounded[name] = round_size(value, multiple)
            if rounded[name] != value:
                logger.warning("%s=%d is not a multiple of %d; using %d", name, value, multiple, rounded[name])
        return rounded


class ImageNoiseUnit(PipelineUnit):
    """Draws an image pipeline's initial noise ``(1, latent_channels, height / p, width / p)``, ``p`` its
    ``pixels_per_latent``, from ``seed`` on ``rand_device`` when given."""

    def __init__(self) -> None:
        super().__init__(input_params=("height", "width", "seed", "rand_device"), output_params=("noise",))

    def process(self, pipe: TextToLatentPipeline, height: int, width: int, seed: int | None,
                rand_device: str | torch.device | None) -> dict:
        scale = pipe.pixels_per_latent
        return {"noise": draw_noise(pipe, (1, pipe.latent_channels, height // scale, width // scale), seed,
                                    rand_device)}


class InputImageEmbedderUnit(PipelineUnit):
    """Encodes ``input_image``, resized to ``height x width`` if it differs, with the pipeline's ``encode_image``:
    the training target, or an image-to-image start."""

    def __init__(self) -> None:
        super().__init__(input_params=("input_image", "height", "width"), output_params=("input_latents",),
                         onload_model_names=("vae",))

    def process(self, pipe: TextToLatentPipeline, input_image: Image.Image | None, height: int, width: int) -> dict:
        if input_image is None:
            return {}
        if input_image.size != (width, height):
            input_image = input_image.resize((width, height), Image.Resampling.LANCZOS)
        return {"input_latents": pipe.encode_image(input_image)}


class LatentsUnit(PipelineUnit):
    """The latents the denoising loop starts from: the noise, or the input noised to the first timestep."""

    def __init__(self) -> None:
        super().__init__(input_params=("noise", "input_latents", "denoising_strength"), output_params=("latents",))

    def process(self, pipe: BasePipeline, noise: torch.Tensor, input_latents: torch.Tensor | None,
                denoising_strength: float | None) -> dict:
        if input_latents is None or denoising_strength in (None, 1.0):
            return {"latents": noise}
        return {"latents": pipe.scheduler.add_noise(input_latents, noise, pipe.scheduler.timesteps[0])}


class TextToLatentPipeline(BasePipeline):
    """The shape Qwen-Image and Wan share: a ``dit``, a ``vae`` with normalised latents, a text encoder and tokenizer.

    Subclasses set ``scheduler_preset`` and ``self.units``.
    """

    scheduler_preset = ""
    latent_channels = 16
    #: Pixels per latent cell side of the state's latents (the VAE's compression, times a patchify done in the state).
    pixels_per_latent = 8
    input_types = {
        "seed": integer, "rand_device": text, "num_inference_steps": positive_integer, "cfg_scale": real,
        "denoising_strength": real, "max_sequence_length": positive_integer, "height": positive_integer,
        "width": positive_integer,
    }  # fmt: skip

    def __init__(self, device: str | torch.device = "cpu", torch_dtype: torch.dtype = torch.bfloat16,
                 offload_device: str | torch.device = "cpu", manage_model_devices: bool = True) -> None:
        super().__init__(device=device, torch_dtype=torch_dtype, offload_device=offload_device,
                         manage_model_devices=manage_model_devices)
        self.dit: torch.nn.Module | None = None
        self.vae: torch.nn.Module | None = None
        self.text_encoder: torch.nn.Module | None = None
        self.tokenizer: Any = None
        self.scheduler = scheduler_from_preset(self.scheduler_preset)

    def encode_image(self, image: Image.Image) -> torch.Tensor:
        """An image as the state's normalised latents, from the VAE's distribution mode rather than a sample, so a
        cached latent equals the one a single-stage run computes. Image pipelines implement it."""
        raise NotImplementedError(f"{type(self).__name__} encodes no single image")

    def save_output(self, output: Image.Image, stem: Path, fps: int = 16) -> Path:
        """Writes an image as ``<stem>.png``, atomically (``fps`` is for video pipelines, which override this)."""
        path = stem.with_suffix(".png")
        return atomic_write(path, lambda temporary: output.save(temporary, format="PNG"))

    def size_multiple(self) -> int:
        """Pixels per latent token side (VAE compression times the 2x2 patch); heights and widths are rounded to it."""
        return SIZE_MULTIPLE

    def latent_statistics(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The VAE's per-channel latent ``mean`` and ``1 / std``, shaped to broadcast over ``like``."""
        shape = (1, -1) + (1,) * (like.dim() - 2)
        mean = torch.tensor(self.vae.config.latents_mean).view(shape).to(like.device, like.dtype)
        inverse_std = 1.0 / torch.tensor(self.vae.config.latents_std).view(shape).to(like.device, like.dtype)
        return mean, inverse_std


def load_if_on_disk(config: ModelConfig | None, load: Callable[[ModelConfig], Any]) -> Any:
    """``load(config)`` when ``config``'s files are on disk already, else None: nothing is downloaded."""
    if config is None:
        return None
    if config.model_id is not None:
        config = ModelConfig(model_id=config.model_id, origin_file_pattern=config.origin_file_pattern,
                             skip_download=True)
    try:
        resolve_files(config)
    except FileNotFoundError:
        return None
    return load(config)


def preprocessor_folder(config: ModelConfig, fix: str) -> Path:
    """The folder among ``config``'s files (downloaded when missing) that holds a ``preprocessor_config.json``.

    Raises:
        ModelLoadError: None does; the message ends with ``fix`` (where to point the config instead).
    """
    files = resolve_files(config)
    folders = [path if path.is_dir() else path.parent for path in files]
    folder = next((f for f in folders if (f / "preprocessor_config.json").is_file()), None)
    if folder is None:
        raise ModelLoadError(f"{config.describe()} resolved to {[str(f) for f in files]}, which hold no "
                             f"preprocessor_config.json; {fix}")
    return folder
