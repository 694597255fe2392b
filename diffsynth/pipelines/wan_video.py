"""Wan text-to-video, video-to-video and image-to-video as declared units over the diffusers / transformers models.

Models, by pipeline name: ``dit`` (``WanTransformer3DModel``), ``vae`` (``AutoencoderKLWan``), ``text_encoder``
(``UMT5EncoderModel``) and ``tokenizer``, loaded from a diffusers-layout repository such as
``Wan-AI/Wan2.1-T2V-1.3B-Diffusers``. The computation follows diffusers' ``WanPipeline`` (prompt cleaning, UMT5
embeddings zero-padded to ``max_sequence_length``, latents ``(1, 16, (frames - 1) / 4 + 1, height / 8, width / 8)``,
plain CFG, latent de-normalisation), so with the same scheduler both produce the same video.

Image-to-video (Wan2.1 I2V, e.g. ``Wan-AI/Wan2.1-I2V-14B-480P-Diffusers``) adds ``image_encoder``
(``CLIPVisionModel``) and ``image_processor`` (``CLIPImageProcessor``, read from the repository's
``image_processor/`` folder) and follows diffusers' ``WanImageToVideoPipeline``: the transformer's ``hidden_states``
are the noisy latents concatenated along channels with ``y`` (a 4-channel first-frame mask and the normalised VAE
latents of a video whose first frame is ``input_image`` and whose other frames are zero), and its
``encoder_hidden_states_image`` are the CLIP encoder's penultimate hidden states (``clip_feature``), shared by both
CFG branches. Which inputs a transformer takes is read from its config: ``in_channels`` above ``out_channels`` means
``y``, a set ``image_dim`` means ``clip_feature``.

The schedule differs by default: this pipeline samples and trains with the flow-matching Euler schedule at shift 5
(the reference trainer's choice for Wan), while the diffusers repositories ship ``UniPCMultistepScheduler`` with
``flow_shift=3``. To reproduce diffusers exactly, set ``pipe.scheduler = DiffusersScheduler(that scheduler)``.
"""

from __future__ import annotations

import html
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from ..core.loader import ModelConfig, ModelLoadError, resolve_files
from ..diffusion.base_pipeline import PipelineUnit
from .common import (LatentsUnit, ShapeCheckUnit, TextToLatentPipeline, draw_noise, image_to_tensor, round_size,
                     tensor_to_images)

__all__ = ["ModelConfig", "WanVideoPipeline", "save_video"]

logger = logging.getLogger(__name__)

VAE_SCALE = 8
VAE_TEMPORAL_SCALE = 4

MODEL_ROLES = {
    "WanTransformer3DModel": "dit",
    "AutoencoderKLWan": "vae",
    "UMT5EncoderModel": "text_encoder",
    "CLIPVisionModel": "image_encoder",
}
# Channels of the first-frame mask in ``y``: one per pixel frame folded into a latent frame.
MASK_CHANNELS = VAE_TEMPORAL_SCALE


def clean_prompt(text: str) -> str:
    """Unescapes HTML entities and collapses whitespace, as diffusers does before tokenising (ftfy aside)."""
    try:
        import ftfy

        text = ftfy.fix_text(text)
    except ImportError:
        pass
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


def round_frames(num_frames: int) -> int:
    """The largest count of the form 4k+1 not above ``num_frames`` (at least 1)."""
    return max(1, (int(num_frames) - 1) // VAE_TEMPORAL_SCALE * VAE_TEMPORAL_SCALE + 1)


def video_to_tensor(frames: Sequence[Image.Image]) -> torch.Tensor:
    """RGB frames as a ``(1, 3, frames, H, W)`` float32 tensor in ``[-1, 1]``."""
    return torch.stack([image_to_tensor(frame)[0] for frame in frames], dim=1).unsqueeze(0)


def save_video(frames: Sequence[Image.Image], path: str | Path, fps: int = 15, quality: int = 8) -> Path:
    """Writes frames as an ``.mp4`` (PyAV; H.264, or MPEG-4 Part 2 where FFmpeg lacks libx264) or an animated
    ``.gif`` (Pillow), chosen by the suffix.

    Args:
        frames: PIL images of one size.
        path: Output file; ``.mp4`` or ``.gif``.
        fps: Frames per second.
        quality: For H.264, 0 (smallest file) to 10 (best); mapped to the encoder's CRF.
    """
    from ..core.files import atomic_write

    path = Path(path)
    if path.suffix.lower() == ".gif":
        return atomic_write(path, lambda temporary: frames[0].save(
            temporary, format="GIF", save_all=True, append_images=list(frames[1:]), duration=int(1000 / fps), loop=0))
    if path.suffix.lower() != ".mp4":
        raise ValueError(f"save_video: {path} must end in .mp4 or .gif")

    def write(temporary: Path) -> None:
        import av

        with av.open(str(temporary), mode="w", format="mp4") as container:
            try:
                stream = container.add_stream("libx264", rate=fps)
            except (ValueError, av.error.FFmpegError):  # an FFmpeg build without libx264
                stream = container.add_stream("mpeg4", rate=fps)
            stream.width, stream.height = frames[0].size
            stream.pix_fmt = "yuv420p"
            if stream.codec_context.name == "libx264":
                stream.options = {"crf": str(round(51 - 4.6 * quality))}
            for frame in frames:
                container.mux(stream.encode(av.VideoFrame.from_image(frame.convert("RGB"))))
            container.mux(stream.encode())

    return atomic_write(path, write)


class FrameCountUnit(PipelineUnit):
    """Rounds ``num_frames`` down to the form 4k+1 that the VAE's 4x temporal compression needs, with a warning."""

    def __init__(self) -> None:
        super().__init__(input_params=("num_frames",), output_params=("num_frames",))

    def process(self, pipe: WanVideoPipeline, num_frames: int) -> dict:
        if not isinstance(num_frames, int) or num_frames < 1:
            raise ValueError(f"num_frames={num_frames!r} must be a positive frame count of the form 4k+1, e.g. 81")
        rounded = round_frames(num_frames)
        if rounded != num_frames:
            logger.warning("num_frames=%d is not of the form 4k+1; using %d", num_frames, rounded)
        return {"num_frames": rounded}


class NoiseUnit(PipelineUnit):
    """Draws the initial noise ``(1, 16, (num_frames - 1) / 4 + 1, height / 8, width / 8)``."""

    def __init__(self) -> None:
        super().__init__(input_params=("height", "width", "num_frames", "seed", "rand_device"),
                         output_params=("noise",))

    def process(self, pipe: WanVideoPipeline, height: int, width: int, num_frames: int, seed: int | None,
                rand_device: str | torch.device | None) -> dict:
        latent_frames = (num_frames - 1) // VAE_TEMPORAL_SCALE + 1
        shape = (1, pipe.latent_channels, latent_frames, height // VAE_SCALE, width // VAE_SCALE)
        return {"noise": draw_noise(pipe, shape, seed, rand_device)}


class InputVideoEmbedderUnit(PipelineUnit):
    """Encodes ``input_video`` (a list of frames) with the Wan VAE into normalised latents.

    Frames are resized to ``height x width`` if they differ, and the first ``num_frames`` are used. The VAE's
    distribution mode is used rather than a sample, so a cached latent equals the one a single-stage run computes.
    """

    def __init__(self) -> None:
        super().__init__(input_params=("input_video", "height", "width", "num_frames"),
                         output_params=("input_latents",), onload_model_names=("vae",))

    def process(self, pipe: WanVideoPipeline, input_video: Sequence[Image.Image] | None, height: int, width: int,
                num_frames: int) -> dict:
        if input_video is None:
            return {}
        if len(input_video) < num_frames:
            raise ValueError(f"input_video has {len(input_video)} frames, fewer than num_frames={num_frames}; pass "
                             f"num_frames={round_frames(len(input_video))} or a longer video")
        frames = [frame if frame.size == (width, height) else frame.resize((width, height), Image.Resampling.LANCZOS)
                  for frame in input_video[:num_frames]]
        pixels = video_to_tensor(frames).to(pipe.device, pipe.vae.dtype)
        latents = pipe.vae.encode(pixels).latent_dist.mode()
        mean, inverse_std = pipe.latent_statistics(latents)
        return {"input_latents": ((latents - mean) * inverse_std).to(pipe.torch_dtype)}


def _check_image(input_image: Any) -> Image.Image:
    if not isinstance(input_image, Image.Image):
        raise TypeError(f"input_image must be one PIL image (the first frame), got {type(input_image).__name__}; "
                        "load it with PIL.Image.open(path)")
    return input_image


class ImageConditionUnit(PipelineUnit):
    """Builds ``y``, the image-to-video condition the transformer reads beside the noisy latents.

    ``y`` is ``(1, 4 + 16, latent frames, height / 8, width / 8)``: a mask that is one on the first latent frame and
    zero elsewhere, then the normalised VAE latents (distribution mode) of a video whose first frame is
    ``input_image`` resized to ``height x width`` and whose other frames are zero. ``y`` is ``None`` when the model
    takes no image. This is also where a mismatch between the inputs and the transformer is reported, before any
    encoder runs.
    """

    def __init__(self) -> None:
        super().__init__(input_params=("input_image", "height", "width", "num_frames"), output_params=("y",),
                         onload_model_names=("vae",))

    def process(self, pipe: WanVideoPipeline, input_image: Image.Image | None, height: int, width: int,
                num_frames: int) -> dict:
        if input_image is None:
            # Without a loaded transformer (a stage that leaves it out) there is nothing to check against.
            if pipe.dit is not None and pipe.takes_image_condition():
                raise ValueError(f"{pipe.describe_transformer()} is an image-to-video model and needs the first "
                                 "frame: pass input_image=<PIL image>, or load a text-to-video Wan transformer")
            return {"y": None}
        _check_image(input_image)
        if not pipe.takes_image_condition():
            # Dropping the image silently would return a video unrelated to it.
            raise ValueError(f"input_image was given, but {pipe.describe_transformer()} takes no image (a "
                             "text-to-video model); load an image-to-video Wan (e.g. "
                             "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers), or drop input_image (to start from existing "
                             "frames, pass input_video)")
        image = input_image.convert("RGB")
        if image.size != (width, height):
            image = image.resize((width, height), Image.Resampling.LANCZOS)  # diffusers' VideoProcessor default
        first = image_to_tensor(image)
        video = torch.zeros(1, 3, num_frames, height, width)
        video[:, :, 0] = first[0]
        latents = pipe.vae.encode(video.to(pipe.device, pipe.vae.dtype)).latent_dist.mode().float()
        mean, inverse_std = pipe.latent_statistics(latents)
        # diffusers repeats the first pixel frame's mask 4 times and folds 4 pixel frames into each latent frame,
        # which amounts to ones on latent frame 0 and zeros elsewhere.
        mask = torch.zeros(1, MASK_CHANNELS, *latents.shape[2:], device=latents.device)
        mask[:, :, 0] = 1
        condition = torch.cat([mask, (latents - mean) * inverse_std], dim=1)
        return {"y": condition.to(pipe.torch_dtype)}


class ImageEmbedderUnit(PipelineUnit):
    """Encodes ``input_image`` with the CLIP vision encoder into ``clip_feature`` (its penultimate hidden states).

    The image goes to the CLIP processor as given (it resizes and crops on its own). ``clip_feature`` is ``None``
    without an image or when the transformer has no image cross-attention (``image_dim`` unset). It is shared state:
    diffusers gives both CFG branches the same image embeddings.
    """

    def __init__(self) -> None:
        super().__init__(input_params=("input_image",), output_params=("clip_feature",),
                         onload_model_names=("image_encoder",))

    def process(self, pipe: WanVideoPipeline, input_image: Image.Image | None) -> dict:
        if input_image is None or not pipe.takes_image_embedding():
            return {"clip_feature": None}
        _check_image(input_image)
        if pipe.image_encoder is None:
            raise ValueError("this transformer reads CLIP image features (image_dim="
                             f"{pipe.dit.config.image_dim}), so input_image needs the image encoder; add "
                             "'<model_id>:image_encoder/model*.safetensors' to the model configs")
        if pipe.image_processor is None:
            raise ValueError("encoding input_image needs the CLIP image processor; load the pipeline with "
                             "from_pretrained from a repository that has image_processor/, or pass "
                             "image_processor_config=ModelConfig(...) naming that folder")
        pixels = pipe.image_processor(images=input_image, return_tensors="pt").pixel_values
        hidden = pipe.image_encoder(pixel_values=pixels.to(pipe.device, pipe.image_encoder.dtype),
                                    output_hidden_states=True).hidden_states
        return {"clip_feature": hidden[-2].to(pipe.torch_dtype)}


class PromptEmbedderUnit(PipelineUnit):
    """Encodes the prompt (and, with CFG, the negative prompt) with UMT5.

    The embeddings of the real tokens are kept and zero-padded to ``max_sequence_length``, as the model was trained.
    """

    def __init__(self) -> None:
        super().__init__(separate_cfg=True, input_params=("max_sequence_length",),
                         input_params_posi={"prompt": "prompt"}, input_params_nega={"prompt": "negative_prompt"},
                         output_params=("prompt_emb",), onload_model_names=("text_encoder",))

    def process(self, pipe: WanVideoPipeline, prompt: str | None, max_sequence_length: int | None) -> dict:
        if pipe.text_encoder is None or pipe.tokenizer is None:
            raise ValueError("encoding a prompt needs the text encoder and tokenizer; add "
                             "'<model_id>:text_encoder/model*.safetensors' to the model configs")
        length = max_sequence_length or 512
        tokens = pipe.tokenizer([clean_prompt(prompt or "")], padding="max_length", max_length=length,
                                truncation=True, add_special_tokens=True, return_attention_mask=True,
                                return_tensors="pt")
        ids, mask = tokens.input_ids.to(pipe.device), tokens.attention_mask.to(pipe.device)
        hidden = pipe.text_encoder(ids, mask).last_hidden_state
        kept = int(mask.gt(0).sum())
        embeddings = torch.zeros_like(hidden)
        embeddings[:, :kept] = hidden[:, :kept]
        return {"prompt_emb": embeddings.to(pipe.torch_dtype)}


class WanVideoPipeline(TextToLatentPipeline):
    """Wan video generation and the computation its training shares; see the module docstring."""

    denoising_model_names = ("dit",)
    model_roles = MODEL_ROLES
    model_fn_params = ("prompt_emb", "y", "clip_feature")
    training_columns = ("video", "prompt")
    # The reference's Wan commands name layers as in the original Wan code; suffixes match self- and cross-attention.
    lora_target_aliases = {"q": "to_q", "k": "to_k", "v": "to_v", "o": "to_out.0", "ffn.0": "ffn.net.0.proj",
                           "ffn.2": "ffn.net.2", "k_img": "add_k_proj", "v_img": "add_v_proj"}
    scheduler_preset = "wan"

    def __init__(self, device: str | torch.device = "cpu", torch_dtype: torch.dtype = torch.bfloat16,
                 offload_device: str | torch.device = "cpu", manage_model_devices: bool = True) -> None:
        super().__init__(device=device, torch_dtype=torch_dtype, offload_device=offload_device,
                         manage_model_devices=manage_model_devices)
        self.image_encoder: torch.nn.Module | None = None
        self.image_processor: Any = None
        # The image-condition unit runs next to the video encoder, so the VAE is onloaded once for both.
        self.units = [ShapeCheckUnit(), FrameCountUnit(), NoiseUnit(), InputVideoEmbedderUnit(), ImageConditionUnit(),
                      LatentsUnit(), PromptEmbedderUnit(), ImageEmbedderUnit()]

    @classmethod
    def from_pretrained(cls, torch_dtype: torch.dtype | str = torch.bfloat16, device: str | torch.device = "cpu",
                        model_configs: Sequence[ModelConfig] = (), tokenizer_config: ModelConfig | None = None,
                        offload_device: str | torch.device = "cpu", skeleton_configs: Sequence[ModelConfig] = (),
                        image_processor_config: ModelConfig | None = None) -> WanVideoPipeline:
        """Loads the models as ``BasePipeline.from_pretrained`` does, plus the CLIP image processor.

        Args:
            torch_dtype: Weight and activation dtype.
            device: The compute device.
            model_configs: One config per model (any subset of ``dit``, ``vae``, ``text_encoder``,
                ``image_encoder``).
            tokenizer_config: The tokenizer folder; default: ``tokenizer/`` beside the text encoder.
            offload_device: Where models wait while not in use.
            skeleton_configs: Entries of ``model_configs`` to build without weights.
            image_processor_config: The ``CLIPImageProcessor`` folder. When an image encoder is loaded and this is
                ``None``, the ``image_processor/`` folder of the image encoder's repository is used (for local
                paths, the ``image_processor`` folder beside the image encoder's folder, if there is one).

        Raises:
            ValueError: As ``BasePipeline.from_pretrained``.
            ModelLoadError: The image processor folder holds no readable ``preprocessor_config.json``.
        """
        pipe = super().from_pretrained(torch_dtype=torch_dtype, device=device, model_configs=model_configs,
                                       tokenizer_config=tokenizer_config, offload_device=offload_device,
                                       skeleton_configs=skeleton_configs)
        config = image_processor_config or cls._companions(pipe.model_configs, tokenizer_config).get("image_processor")
        if config is not None:
            pipe.image_processor = load_image_processor(config)
        return pipe

    @classmethod
    def _companions(cls, roles: dict[str, ModelConfig], tokenizer_config: ModelConfig | None) -> dict[str, ModelConfig]:
        """The tokenizer as in ``BasePipeline``, plus the image processor beside a loaded image encoder."""
        companions = super()._companions(roles, tokenizer_config)
        processor = _sibling_image_processor(roles["image_encoder"]) if "image_encoder" in roles else None
        if processor is not None:
            companions["image_processor"] = processor
        return companions

    def takes_image_condition(self) -> bool:
        """Whether the transformer reads ``y`` (``in_channels`` above ``out_channels``).

        Without a transformer (a stage that does not load it) the image encoder's presence decides.
        """
        if self.dit is None:
            return self.image_encoder is not None
        return self.dit.config.in_channels != self.dit.config.out_channels

    def takes_image_embedding(self) -> bool:
        """Whether the transformer reads ``clip_feature`` (its ``image_dim`` is set)."""
        if self.dit is None:
            return self.image_encoder is not None
        return self.dit.config.image_dim is not None

    def describe_transformer(self) -> str:
        """The transformer's image-related config, for error messages."""
        if self.dit is None:
            return "the pipeline (no transformer loaded, no image encoder)"
        return f"the transformer (in_channels={self.dit.config.in_channels}, image_dim={self.dit.config.image_dim})"

    def training_inputs(self, sample: dict[str, Any], extra_inputs: Sequence[str] = ()) -> tuple[dict, dict, dict]:
        """The unit state for one dataset sample (``video`` frames, ``prompt``, and the ``extra_inputs`` columns).

        For an image-to-video transformer the condition image is the sample's ``input_image`` column when it has
        one, else the video's first frame (what the model is trained to continue), so video-only datasets train it
        too. A text-to-video transformer gets no image unless the sample has an ``input_image`` column.

        Raises:
            ValueError: ``input_image`` is a path that was not loaded.
        """
        frames = sample["video"]
        input_image = sample.get("input_image")
        if isinstance(input_image, str):
            raise ValueError(f"the input_image column holds the path {input_image!r}, not an image; add input_image "
                             "to --data_file_keys (e.g. --data_file_keys video,input_image) so it is loaded")
        if input_image is None and self.takes_image_condition():
            input_image = frames[0]
        inputs_shared = {
            "input_video": frames, "height": frames[0].height, "width": frames[0].width, "num_frames": len(frames),
            "cfg_scale": 1, "seed": None, "rand_device": "cpu", "denoising_strength": 1.0, "max_sequence_length": 512,
            "input_image": input_image, **{name: sample[name] for name in extra_inputs},
        }  # fmt: skip
        return inputs_shared, {"prompt": sample["prompt"]}, {}

    def model_fn(self, latents: torch.Tensor, timestep: torch.Tensor | float, prompt_emb: torch.Tensor,
                 y: torch.Tensor | None = None, clip_feature: torch.Tensor | None = None, **_: Any) -> torch.Tensor:
        """The transformer's velocity prediction for ``latents`` at ``timestep`` (scale 0 to 1000).

        With an image-to-video transformer, ``y`` is concatenated to the latents along channels and
        ``clip_feature`` goes to the image cross-attention.

        Raises:
            ValueError: The channels given (latents plus ``y``) are not the transformer's ``in_channels``.
        """
        timestep = torch.as_tensor(timestep, device=latents.device).reshape(-1).expand(latents.shape[0])
        hidden = latents if y is None else torch.cat([latents, y.to(latents.dtype)], dim=1)
        if hidden.shape[1] != self.dit.config.in_channels:
            raise ValueError(f"the transformer takes in_channels={self.dit.config.in_channels}, but got "
                             f"{hidden.shape[1]} (latents {latents.shape[1]} + y "
                             f"{0 if y is None else y.shape[1]}); an image-to-video transformer needs input_image, "
                             "a text-to-video one must not get it")
        return self.dit(hidden_states=hidden.to(self.dit.dtype), timestep=timestep, encoder_hidden_states=prompt_emb,
                        encoder_hidden_states_image=clip_feature, return_dict=False)[0]

    def decode(self, inputs_shared: dict, inputs_posi: dict, inputs_nega: dict) -> torch.Tensor:
        """The final latents through the VAE, as ``(B, frames, 3, H, W)`` values in ``[0, 1]``."""
        self.load_models_to_device(["vae"])
        latents = inputs_shared["latents"].to(self.vae.dtype)
        mean, inverse_std = self.latent_statistics(latents)
        video = self.vae.decode(latents / inverse_std + mean, return_dict=False)[0]
        return (video / 2 + 0.5).clamp(0, 1).permute(0, 2, 1, 3, 4)

    @torch.no_grad()
    def __call__(self, prompt: str, negative_prompt: str = "", cfg_scale: float = 5.0,
                 input_video: Sequence[Image.Image] | None = None, input_image: Image.Image | None = None,
                 denoising_strength: float = 1.0,
                 height: int = 480, width: int = 832, num_frames: int = 81, seed: int | None = None,
                 rand_device: str = "cpu", num_inference_steps: int = 50, max_sequence_length: int = 512,
                 output_type: str = "pil", progress_bar: bool = True) -> list[Image.Image] | torch.Tensor:
        """Generates one video.

        Args:
            prompt: What to show.
            negative_prompt: What to steer away from; used when ``cfg_scale`` is not 1.
            cfg_scale: Classifier-free guidance scale; 1 turns CFG off and halves the work per step.
            input_video: Start from these frames instead of pure noise (video-to-video).
            input_image: The first frame, for an image-to-video model (which needs it); resized to
                ``height x width``. A text-to-video model rejects it.
            denoising_strength: With ``input_video``: how much of the schedule to run (1 ignores the video).
            height: Frame height in pixels, rounded to a multiple of 16.
            width: Frame width in pixels, rounded to a multiple of 16.
            num_frames: Frame count, rounded down to the form 4k+1.
            seed: Noise seed; ``None`` draws from torch's global generator.
            rand_device: Device the noise is drawn on.
            num_inference_steps: Denoising steps.
            max_sequence_length: Prompt tokens the text encoder sees (padded to this length).
            output_type: ``"pil"`` for a list of frames, ``"pt"`` for a ``(1, frames, 3, H, W)`` tensor in ``[0, 1]``.
            progress_bar: Show a progress bar over the steps.
        """
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be one string, got {type(prompt).__name__}; call once per prompt")
        if output_type not in ("pil", "pt"):
            raise ValueError(f"output_type={output_type!r} must be 'pil' or 'pt'")
        latent_shape = (1, self.latent_channels, (round_frames(num_frames) - 1) // VAE_TEMPORAL_SCALE + 1,
                        round_size(height) // VAE_SCALE, round_size(width) // VAE_SCALE)
        self.set_inference_timesteps(num_inference_steps, denoising_strength, latent_shape=latent_shape)
        inputs_shared = {
            "cfg_scale": cfg_scale, "input_video": input_video, "input_image": input_image,
            "denoising_strength": denoising_strength,
            "height": height, "width": width, "num_frames": num_frames, "seed": seed, "rand_device": rand_device,
            "max_sequence_length": max_sequence_length,
        }  # fmt: skip
        video = self.denoise(inputs_shared, {"prompt": prompt}, {"negative_prompt": negative_prompt},
                             progress_bar=progress_bar)
        return video if output_type == "pt" else tensor_to_images(video[0])


def _sibling_image_processor(encoder_config: ModelConfig) -> ModelConfig | None:
    """The ``image_processor/`` folder of the repository (or local folder tree) the image encoder came from."""
    if encoder_config.model_id is not None:
        return ModelConfig(model_id=encoder_config.model_id, origin_file_pattern="image_processor/")
    first = Path(encoder_config.path if isinstance(encoder_config.path, str) else encoder_config.path[0])
    folder = (first if first.is_dir() else first.parent).parent / "image_processor"
    return ModelConfig(path=str(folder)) if folder.is_dir() else None


def load_image_processor(config: ModelConfig) -> Any:
    """Resolves an image-processor folder (e.g. pattern ``"image_processor/"``) and loads its ``CLIPImageProcessor``.

    Raises:
        ModelLoadError: The folder holds no ``preprocessor_config.json``, or transformers cannot read it.
    """
    files = resolve_files(config)
    folders = [path if path.is_dir() else path.parent for path in files]
    folder = next((f for f in folders if (f / "preprocessor_config.json").is_file()), None)
    if folder is None:
        raise ModelLoadError(f"{config.describe()} resolved to {[str(f) for f in files]}, which hold no "
                             "preprocessor_config.json; point it at the repository's image_processor/ folder")
    from transformers import CLIPImageProcessor

    try:
        return CLIPImageProcessor.from_pretrained(str(folder))
    except Exception as error:  # noqa: BLE001 - processor errors come in many types
        raise ModelLoadError(f"cannot load the image processor in {folder} ({type(error).__name__}: {error}); "
                             "restore the repository's preprocessor_config.json") from error
