"""Pieces every pipeline family shares: size rounding, noise, image tensors and the starting-latents unit."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from ..core.data.cells import integer, positive_integer, real, text
from ..core.device import resolve_device
from ..core.files import atomic_write
from ..core.loader import ModelConfig, ModelLoadError, load_tokenizer, resolve_files
from ..diffusion.base_pipeline import BasePipeline, PipelineUnit
from ..diffusion.flow_match import FlowMatchScheduler
from .registry import scheduler_preset

logger = logging.getLogger(__name__)

# Pixels per latent token side: the VAEs downsample by 8 and the transformers patch 2x2 latents.
SIZE_MULTIPLE = 16


@dataclass
class ControlNetInput:
    """One ControlNet input, as the reference spells it (its one class for every family's ControlNets). Each pipeline
    reads the fields its ControlNets have and refuses, by name, a field it cannot honour.

    Attributes:
        controlnet_id: Which loaded ControlNet reads it (their load order).
        scale: Multiplies the ControlNet's contribution; 0 turns it off.
        start: Where in the schedule it starts acting (1.0: from the first step).
        end: Where it stops (0.0: to the last step).
        image: The control image (edges, depth, a pose; Tile: a low-resolution image; Inpaint: the image to fill).
        inpaint_image: An image to inpaint from, for the ControlNets that read one.
        inpaint_mask: The region to fill (white), as an image.
        processor_id: An annotator the reference runs on ``image`` first.
    """

    controlnet_id: int = 0
    scale: float = 1.0
    start: float = 1.0
    end: float = 0.0
    image: Image.Image | None = None
    inpaint_image: Image.Image | None = None
    inpaint_mask: Image.Image | None = None
    processor_id: str | None = None


def round_size(value: int, multiple: int = SIZE_MULTIPLE) -> int:
    """``value`` rounded to the nearest multiple of ``multiple`` (halves up), at least ``multiple``."""
    return max(multiple, (int(value) + multiple // 2) // multiple * multiple)


def image_to_tensor(image: Image.Image) -> torch.Tensor:
    """An RGB PIL image as a ``(1, 3, H, W)`` float32 tensor in ``[-1, 1]``."""
    array = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(array).permute(2, 0, 1).unsqueeze(0) * 2.0 - 1.0


def video_to_tensor(frames: Sequence[Image.Image]) -> torch.Tensor:
    """RGB frames as a ``(1, 3, frames, H, W)`` float32 tensor in ``[-1, 1]``."""
    return torch.stack([image_to_tensor(frame)[0] for frame in frames], dim=1).unsqueeze(0)


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


def mux_video_frames(container: Any, frames: list[Image.Image], fps: float, quality: int = 8) -> None:
    """Encodes ``frames`` into a new video stream of an open PyAV ``container``: H.264 (MPEG-4 Part 2 where FFmpeg
    lacks libx264) in yuv420p at ``fps``; ``quality`` 0 (smallest file) to 10 (best) maps to H.264's CRF."""
    import av

    rate = Fraction(fps).limit_denominator(1001)  # PyAV takes a rational rate; 23.976 becomes 24000/1001
    try:
        stream = container.add_stream("libx264", rate=rate)
    except (ValueError, av.error.FFmpegError):  # an FFmpeg build without libx264
        stream = container.add_stream("mpeg4", rate=rate)
    stream.width, stream.height = frames[0].size
    stream.pix_fmt = "yuv420p"
    if stream.codec_context.name == "libx264":
        stream.options = {"crf": str(round(51 - 4.6 * quality))}
    for frame in frames:
        container.mux(stream.encode(av.VideoFrame.from_image(frame.convert("RGB"))))
    container.mux(stream.encode())


def draw_noise(pipe: BasePipeline, shape: tuple[int, ...], seed: int | None, rand_device: Any) -> torch.Tensor:
    """Gaussian noise of ``shape`` in the pipeline's dtype, drawn on ``rand_device`` (CPU noise is the same on every
    machine) from ``seed`` or torch's global generator, then moved to the compute device."""
    rand_device = resolve_device(rand_device or "cpu", "rand_device")
    generator = None if seed is None else torch.Generator(rand_device).manual_seed(seed)
    noise = torch.randn(shape, generator=generator, device=rand_device, dtype=pipe.torch_dtype)
    return noise.to(pipe.device)


def vision_language_model(text_encoder: torch.nn.Module) -> torch.nn.Module:
    """The inner ``*VLModel`` of a released ``*ForConditionalGeneration`` text encoder (its LM head is not needed):
    Qwen3-VL for Krea 2 and Ideogram 4."""
    return getattr(text_encoder, "model", text_encoder)


def prompt_only_problems(title: str, inputs: set[str]) -> list[str]:
    """``sample_input_problems`` of a family that renders from the prompt alone (no condition images)."""
    reasons = {"input_image": "is for Wan image-to-video", "edit_image": "is for the editing families"}
    return [f'"{name}" {reason}; {title} renders from the prompt alone'
            for name, reason in reasons.items() if name in inputs]


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


class PromptUnit(PipelineUnit):
    """The shape of every family's prompt unit: it encodes the prompt and, with CFG, the negative prompt, each in its
    own pass (``separate_cfg``). Subclasses set the class attributes and implement ``process(pipe, prompt, ...)``."""

    #: Shared inputs ``process`` reads besides the prompt.
    shared_inputs: tuple[str, ...] = ("max_sequence_length",)
    #: The keys it writes.
    outputs: tuple[str, ...] = ("prompt_emb",)
    #: The models it encodes with.
    encoders: tuple[str, ...] = ("text_encoder",)
    #: The model configs entry that loads the text encoder, named when it is missing.
    text_encoder_entry = "<model_id>:text_encoder/*.safetensors"

    def __init__(self) -> None:
        super().__init__(separate_cfg=True, input_params=self.shared_inputs,
                         input_params_posi={"prompt": "prompt"}, input_params_nega={"prompt": "negative_prompt"},
                         output_params=self.outputs, onload_model_names=self.encoders)

    def require_text_encoder(self, pipe: BasePipeline, entry: str | None = None) -> None:
        """Raises ValueError naming ``entry`` (default ``text_encoder_entry``) when the text encoder or its tokenizer
        is not loaded."""
        if pipe.text_encoder is None or pipe.tokenizer is None:
            raise ValueError("encoding a prompt needs the text encoder and tokenizer; add "
                             f"'{entry or self.text_encoder_entry}' to the model configs")


def pack_latents(latents: torch.Tensor) -> torch.Tensor:
    """``(B, C, H, W)`` latents to ``(B, H/2 * W/2, C * 4)`` tokens of 2x2 patches, as the transformer reads them."""
    batch, channels, height, width = latents.shape
    patches = latents.view(batch, channels, height // 2, 2, width // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return patches.reshape(batch, (height // 2) * (width // 2), channels * 4)


def unpack_latents(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Inverse of ``pack_latents`` for a latent grid of ``height x width``."""
    batch, _, features = tokens.shape
    channels = features // 4
    patches = tokens.view(batch, height // 2, width // 2, channels, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return patches.reshape(batch, channels, height, width)


def image_units(condition_unit: type[PipelineUnit], prompt_unit: type[PipelineUnit]) -> tuple[type[PipelineUnit], ...]:
    """An image family's ``unit_classes``: the size check, the noise, the input image's latents, the family's
    condition images (encoded next to the input image, so the VAE is onloaded once for both), the starting latents
    and the prompt."""
    return ShapeCheckUnit, ImageNoiseUnit, InputImageEmbedderUnit, condition_unit, LatentsUnit, prompt_unit


class TextToLatentPipeline(BasePipeline):
    """The shape every family shares: a ``dit``, a ``vae`` with normalised latents, a text encoder and tokenizer,
    trained on images (``training_media``) unless a family says otherwise.

    Subclasses set ``scheduler_preset``, ``model_roles`` and ``unit_classes``.
    """

    scheduler_preset = ""
    default_torch_dtype = torch.bfloat16
    latent_channels = 16
    #: Pixels per latent cell side of the state's latents (the VAE's compression, times a patchify done in the state).
    pixels_per_latent = 8
    input_types = {
        "seed": integer, "rand_device": text, "num_inference_steps": positive_integer, "cfg_scale": real,
        "denoising_strength": real, "max_sequence_length": positive_integer, "height": positive_integer,
        "width": positive_integer,
    }  # fmt: skip
    #: Dataset columns a training sample needs; ``image`` is a file column.
    training_columns = ("image", "prompt")
    #: Training runs without CFG, from pure noise, with the prompt cut as inference cuts it by default.
    training_state = {
        "cfg_scale": 1, "seed": None, "rand_device": "cpu", "denoising_strength": 1.0, "max_sequence_length": 512,
    }  # fmt: skip

    def _after_init(self) -> None:
        self.scheduler = scheduler_from_preset(self.scheduler_preset)

    def training_media(self, sample: dict[str, Any]) -> dict[str, Any]:
        """The sample's ``image`` (the first, given a list) as ``input_image``, at its own size (the dataset already
        cropped it to a multiple of 16)."""
        image = sample["image"]
        if isinstance(image, list):
            image = image[0]
        return {"input_image": image, "height": image.height, "width": image.width}

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

    def image_latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        """The latents of one image of ``height x width`` pixels, each first rounded as ``ShapeCheckUnit`` rounds it
        (to a multiple of 16)."""
        scale = self.pixels_per_latent
        return 1, self.latent_channels, round_size(height) // scale, round_size(width) // scale

    @staticmethod
    def image_output(images: torch.Tensor, output_type: str) -> Image.Image | torch.Tensor:
        """What ``__call__`` returns for the decoded ``(1, 3, H, W)`` ``images``: a PIL image for ``"pil"``, else the
        tensor as it is (``"pt"``, or ``"latent"`` where ``decode`` skipped the VAE)."""
        return tensor_to_images(images)[0] if output_type == "pil" else images

    def latent_statistics(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The VAE's per-channel latent ``mean`` and ``1 / std``, shaped to broadcast over ``like``."""
        shape = (1, -1) + (1,) * (like.dim() - 2)
        mean = torch.tensor(self.vae.config.latents_mean).view(shape).to(like.device, like.dtype)
        inverse_std = 1.0 / torch.tensor(self.vae.config.latents_std).view(shape).to(like.device, like.dtype)
        return mean, inverse_std


class ScaledLatentPipeline(TextToLatentPipeline):
    """The families whose VAE (``AutoencoderKL``) normalises latents with its config's ``shift_factor`` and
    ``scaling_factor``: FLUX.1 and Z-Image."""

    def encode_image(self, image: Image.Image) -> torch.Tensor:
        """An image as normalised latents ``(1, 16, H/8, W/8)``, from the VAE's distribution mode."""
        pixels = image_to_tensor(image).to(self.device, self.vae.dtype)
        return self.normalise_latents(self.vae.encode(pixels).latent_dist.mode()).to(self.torch_dtype)

    def normalise_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """VAE latents to the transformer's scale: ``(latents - shift_factor) * scaling_factor``."""
        return (latents - self.vae.config.shift_factor) * self.vae.config.scaling_factor

    def decode(self, inputs_shared: dict, inputs_posi: dict, inputs_nega: dict) -> torch.Tensor:
        """The final latents de-normalised and decoded by the VAE, as ``(B, 3, H, W)`` in ``[0, 1]``."""
        self.load_models_to_device(["vae"])
        latents = inputs_shared["latents"].to(self.vae.dtype)
        latents = latents / self.vae.config.scaling_factor + self.vae.config.shift_factor
        images = self.vae.decode(latents, return_dict=False)[0]
        return (images / 2 + 0.5).clamp(0, 1)


class SecondTokenizerPipeline(BasePipeline):
    """A pipeline with a second text encoder (``text_encoder_2``) whose tokenizer is ``tokenizer_2``: FLUX.1's T5,
    SDXL's OpenCLIP. It is loaded beside that encoder: the ``tokenizer_2_config`` option (``--tokenizer_2_path``),
    else ``tokenizer_2/`` of the encoder's repository, else ``default_tokenizer_2_config``.

    Mixed in before the pipeline's base class; ``_after_load`` is the one of ``from_pretrained``.
    """

    #: Where the second tokenizer comes from when neither the option nor the encoder's repository says.
    default_tokenizer_2_config: ModelConfig | None = None
    load_options = ("tokenizer_2_config",)
    extra_attributes = {"tokenizer_2": None}

    def _after_load(self, tokenizer_2_config: ModelConfig | None = None) -> None:
        """Loads the second tokenizer beside the second text encoder.

        Args:
            tokenizer_2_config: Its folder (``--tokenizer_2_path``); default: ``tokenizer_2/`` of the second text
                encoder's repository, else the pipeline's default. (``tokenizer_config`` is the first tokenizer's,
                the reference's ``--tokenizer_1_path``.)
        """
        super()._after_load()
        config = self._second_tokenizer(self.model_configs, tokenizer_2_config)
        if config is not None:
            self.tokenizer_2 = load_tokenizer(config)
            self.model_configs["tokenizer_2"] = config

    @classmethod
    def companion_configs(cls, model_configs: Sequence[ModelConfig], tokenizer_config: ModelConfig | None = None,
                          inputs: Sequence[str] = (), **options: Any) -> list[ModelConfig]:
        """The first tokenizer as in ``BasePipeline``, plus the second (``tokenizer_2_config`` among ``options``)."""
        roles = cls.config_roles(model_configs)
        second = cls._second_tokenizer(roles, options.get("tokenizer_2_config"))
        return [*cls._companions(roles, tokenizer_config).values(), *([second] if second is not None else [])]

    @classmethod
    def _second_tokenizer(cls, roles: dict[str, ModelConfig], tokenizer_2_config: ModelConfig | None
                          ) -> ModelConfig | None:
        """The second tokenizer's folder when the second text encoder is loaded; see the class docstring."""
        text_encoder_2 = roles.get("text_encoder_2")
        if text_encoder_2 is None:
            return None
        if tokenizer_2_config is not None:
            return tokenizer_2_config
        if text_encoder_2.model_id is not None:
            return ModelConfig(model_id=text_encoder_2.model_id, origin_file_pattern="tokenizer_2/")
        return cls.default_tokenizer_2_config


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


def sibling_folder(config: ModelConfig, folder: str, beside_suffix: str | None = None) -> ModelConfig | None:
    """``folder`` in the repository (or local folder tree) ``config`` came from: the same repository for a repository
    config; for local paths, beside the model's own folder, or beside a file ending in ``beside_suffix`` (an
    original release's ``.pth``) itself; None when absent."""
    if config.model_id is not None:
        return ModelConfig(model_id=config.model_id, origin_file_pattern=folder.rstrip("/") + "/")
    first = Path(config.path if isinstance(config.path, str) else config.path[0])
    beside_file = beside_suffix is not None and first.is_file() and first.suffix == beside_suffix
    parent = first.parent if beside_file else (first if first.is_dir() else first.parent).parent
    candidate = parent / folder
    return ModelConfig(path=str(candidate)) if candidate.is_dir() else None


def load_preprocessor(config: ModelConfig, load: Callable[[str], Any], fix: str, what: str, restore: str) -> Any:
    """``load(folder)`` of the folder among ``config``'s files (downloaded when missing) that holds a
    ``preprocessor_config.json``.

    Raises:
        ModelLoadError: None does (the message ends with ``fix``), or ``load`` fails: "cannot load ``what``",
            ending with ``restore``.
    """
    folder = preprocessor_folder(config, fix)
    try:
        return load(str(folder))
    except Exception as error:  # noqa: BLE001 - processor errors come in many types
        raise ModelLoadError(f"cannot load {what} in {folder} ({type(error).__name__}: {error}); {restore}") from error


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
