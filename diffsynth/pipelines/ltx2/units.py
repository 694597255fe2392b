"""The units of an LTX-2 audio-video state and the token layout they share, as diffusers' ``LTX2Pipeline`` and
``LTX2ImageToVideoPipeline`` compute them.

The state's ``latents`` hold both streams as one token sequence ``(B, video tokens + audio tokens, D)``: the video
latents ``(B, C, F, H, W)`` patchified into ``F * H * W`` tokens of ``C`` features (the releases' patch is 1), then
the audio latents ``(B, C_a, L, M)`` as ``L`` tokens of ``C_a * M`` features. The releases make both widths 128, so one
tensor carries the pair through the scheduler, classifier-free guidance and the training loss; ``model_fn`` splits it
at ``video_tokens`` for the transformer. ``latent_grid`` holds ``(F, H, W)`` and ``audio_frames`` holds ``L``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from PIL import Image

from ...core.device import resolve_device
from ...diffusion.base_pipeline import PipelineUnit
from ..common import PromptUnit, image_to_tensor
from .media import recompress_image

if TYPE_CHECKING:
    from .pipeline import LTX2AudioVideoPipeline

logger = logging.getLogger(__name__)

# scheduler/scheduler_config.json of Lightricks/LTX-2 and LTX-2.3: flow-match Euler shifted by the video token count
# and stretched to end at 0.1; diffusers samples it on linspace(1, 1/N, N).
SCHEDULER_CONFIG = {
    "_class_name": "FlowMatchEulerDiscreteScheduler", "base_image_seq_len": 1024, "base_shift": 0.95,
    "invert_sigmas": False, "max_image_seq_len": 4096, "max_shift": 2.05, "num_train_timesteps": 1000, "shift": 1.0,
    "shift_terminal": 0.1, "stochastic_sampling": False, "time_shift_type": "exponential", "use_beta_sigmas": False,
    "use_dynamic_shifting": True, "use_exponential_sigmas": False, "use_karras_sigmas": False,
}  # fmt: skip
# The image-conditioning H.264 CRF of the Gemma-3 generations (diffusers' ``DEFAULT_IMAGE_CRF``, ltx-pipelines'
# default): the first frame is compressed as the training videos were.
DEFAULT_IMAGE_CRF = 33
# The mel bins the audio VAE downsamples by 4 in both time and frequency.
AUDIO_COMPRESSION = 4


def pack_video(latents: torch.Tensor) -> torch.Tensor:
    """``(B, C, F, H, W)`` latents as ``(B, F * H * W, C)`` tokens (patch size 1, the releases')."""
    return latents.flatten(2).transpose(1, 2)


def unpack_video(tokens: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
    """Inverse of ``pack_video`` for a latent grid ``(F, H, W)``."""
    return tokens.transpose(1, 2).unflatten(2, tuple(grid))


def pack_audio(latents: torch.Tensor) -> torch.Tensor:
    """``(B, C, L, M)`` audio latents as ``(B, L, C * M)`` tokens."""
    return latents.transpose(1, 2).flatten(2)


def unpack_audio(tokens: torch.Tensor, mel_bins: int) -> torch.Tensor:
    """Inverse of ``pack_audio`` for ``mel_bins`` latent mel bins."""
    return tokens.unflatten(2, (-1, mel_bins)).transpose(1, 2)


def round_frames(num_frames: int, temporal: int) -> int:
    """The largest count of the form ``temporal * k + 1`` not above ``num_frames`` (at least 1)."""
    return max(1, (int(num_frames) - 1) // temporal * temporal + 1)


class FrameCountUnit(PipelineUnit):
    """Rounds ``num_frames`` down to the form ``8k + 1`` (the video VAE's temporal compression), with a warning, and
    checks ``frame_rate``."""

    def __init__(self) -> None:
        super().__init__(input_params=("num_frames", "frame_rate"), output_params=("num_frames",))

    def process(self, pipe: LTX2AudioVideoPipeline, num_frames: int, frame_rate: float) -> dict:
        temporal = pipe.temporal_compression()
        if not isinstance(num_frames, int) or num_frames < 1:
            raise ValueError(f"num_frames={num_frames!r} must be a positive frame count of the form "
                             f"{temporal}k+1, e.g. 121")
        if not isinstance(frame_rate, (int, float)) or frame_rate <= 0:
            raise ValueError(f"frame_rate={frame_rate!r} must be a positive number of frames per second, e.g. 24")
        rounded = round_frames(num_frames, temporal)
        if rounded != num_frames:
            logger.warning("num_frames=%d is not of the form %dk+1; using %d", num_frames, temporal, rounded)
        return {"num_frames": rounded}


class NoiseUnit(PipelineUnit):
    """Draws the video noise ``(1, C, F, H, W)`` and then the audio noise ``(1, C_a, L, M)`` in float32 from one
    generator seeded with ``seed`` (diffusers' order, so a seed gives diffusers' CPU noise), packed into the token
    layout; the latents stay float32 through the loop, as in diffusers, whatever the models' dtype.

    The audio lasts as long as the video: ``L = round(num_frames / frame_rate * sample_rate / hop / 4)``. With
    reference videos in context (``in_context_latents``), both are drawn packed, the video with the references'
    tokens, as ``LTX2InContextPipeline`` draws them (see ``in_context.py``).
    """

    def __init__(self) -> None:
        super().__init__(input_params=("height", "width", "num_frames", "frame_rate", "seed", "rand_device",
                                       "in_context_latents"),
                         output_params=("noise", "latent_grid", "audio_frames", "video_tokens"))

    def process(self, pipe: LTX2AudioVideoPipeline, height: int, width: int, num_frames: int, frame_rate: float,
                seed: int | None, rand_device: str | torch.device | None,
                in_context_latents: torch.Tensor | None = None) -> dict:
        grid = pipe.latent_grid(height, width, num_frames)
        channels, mel_bins = pipe.audio_latent_shape()
        audio_frames = pipe.audio_frames(num_frames, frame_rate)
        video_shape = (1, pipe.video_latent_channels(), *grid)
        audio_shape = (1, channels, audio_frames, mel_bins)
        device = resolve_device(rand_device or "cpu", "rand_device")
        # One generator for both and float32 whatever the pipeline's dtype, as diffusers draws them.
        generator = None if seed is None else torch.Generator(device).manual_seed(seed)
        tokens = grid[0] * grid[1] * grid[2]
        if in_context_latents is None:
            video, audio = (torch.randn(shape, generator=generator, device=device, dtype=torch.float32)
                            for shape in (video_shape, audio_shape))
            video, audio = pack_video(video), pack_audio(audio)
        else:
            video = torch.randn((1, tokens + in_context_latents.shape[1], video_shape[1]), generator=generator,
                                device=device, dtype=torch.float32)[:, :tokens]
            audio = torch.randn((1, audio_frames, channels * mel_bins), generator=generator, device=device,
                                dtype=torch.float32)
        noise = torch.cat([video, audio], dim=1).to(pipe.device)
        return {"noise": noise, "latent_grid": grid, "audio_frames": audio_frames, "video_tokens": tokens}


class ImageConditionUnit(PipelineUnit):
    """Encodes the first frame of image-to-audio+video, ``input_images[0]``, as normalised latents
    ``first_frame_latents`` ``(1, C, 1, H, W)``, after resizing it to the video's size and recompressing it with
    H.264 at ``image_crf`` (0 skips that), as diffusers' ``LTX2ImageToVideoPipeline`` does."""

    def __init__(self) -> None:
        super().__init__(input_params=("input_images", "image_crf", "height", "width"),
                         output_params=("first_frame_latents",), onload_model_names=("vae",))

    def process(self, pipe: LTX2AudioVideoPipeline, input_images: Sequence[Image.Image] | None,
                image_crf: int | None, height: int, width: int) -> dict:
        if input_images is None:
            return {}
        if isinstance(input_images, Image.Image):
            raise ValueError("input_images takes a list of images: pass input_images=[image]")
        if len(input_images) != 1 or not isinstance(input_images[0], Image.Image):
            raise ValueError(f"input_images holds {len(input_images)} item(s); it takes one PIL image, the first "
                             "frame (other key frames are not supported yet)")
        image = input_images[0].convert("RGB")
        crf = DEFAULT_IMAGE_CRF if image_crf is None else image_crf
        if crf:
            image = recompress_image(image, crf)
        if image.size != (width, height):
            image = image.resize((width, height), Image.Resampling.LANCZOS)
        pixels = image_to_tensor(image).unsqueeze(2).to(pipe.device, pipe.vae.dtype)
        latents = pipe.vae.encode(pixels).latent_dist.mode()
        return {"first_frame_latents": pipe.normalise_video(latents).to(pipe.torch_dtype)}


class LatentsUnit(PipelineUnit):
    """The latents the loop starts from: the noise, with the first frame's tokens replaced by the image's latents when
    there is one (its tokens then stay fixed: ``model_fn`` predicts no velocity for them)."""

    def __init__(self) -> None:
        super().__init__(input_params=("noise", "first_frame_latents"), output_params=("latents",))

    def process(self, pipe: LTX2AudioVideoPipeline, noise: torch.Tensor,
                first_frame_latents: torch.Tensor | None) -> dict:
        if first_frame_latents is None:
            return {"latents": noise}
        return {"latents": with_first_frame(noise, first_frame_latents)}


def with_first_frame(latents: torch.Tensor, first_frame_latents: torch.Tensor) -> torch.Tensor:
    """The token sequence with its first latent frame's tokens replaced by ``first_frame_latents`` ``(B, C, 1, H, W)``."""
    frame = pack_video(first_frame_latents).to(latents)
    if frame.shape[0] != latents.shape[0]:
        frame = frame.expand(latents.shape[0], -1, -1)
    return torch.cat([frame, latents[:, frame.shape[1]:]], dim=1)


class PromptEmbedderUnit(PromptUnit):
    """Encodes the prompt (and, with CFG, the negative prompt) with Gemma 3 and the text connectors.

    The prompt is stripped, left-padded to ``max_sequence_length`` tokens; every hidden state of the text encoder
    (the embeddings and each layer's) is stacked and flattened per token, and the connectors turn them into the
    video and the audio stream's prompt tokens and the mask of the real ones.
    """

    outputs = ("prompt_emb", "audio_prompt_emb", "prompt_emb_mask")
    encoders = ("text_encoder", "connectors")
    text_encoder_entry = "google/gemma-3-12b-it-qat-q4_0-unquantized:model-*.safetensors"

    def process(self, pipe: LTX2AudioVideoPipeline, prompt: str | None, max_sequence_length: int | None) -> dict:
        self.require_text_encoder(pipe)
        if pipe.connectors is None:
            raise ValueError("encoding a prompt needs the text connectors too; add "
                             "'Lightricks/LTX-2:connectors/diffusion_pytorch_model.safetensors' to the model configs")
        tokenizer = pipe.tokenizer
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokens = tokenizer([(prompt or "").strip()], padding="max_length", max_length=max_sequence_length or 1024,
                           truncation=True, add_special_tokens=True, return_tensors="pt").to(pipe.device)
        hidden = pipe.text_encoder(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask,
                                   output_hidden_states=True).hidden_states
        stacked = torch.stack(hidden, dim=-1).flatten(2, 3).to(pipe.text_encoder.dtype)
        video, audio, mask = pipe.connectors(stacked, tokens.attention_mask, padding_side="left")
        return {"prompt_emb": video.to(pipe.torch_dtype), "audio_prompt_emb": audio.to(pipe.torch_dtype),
                "prompt_emb_mask": mask}
