"""LTX-2 text-to-audio+video and image-to-audio+video as declared units over the diffusers / transformers models.

Models, by pipeline name: ``dit`` (``LTX2VideoTransformer3DModel``, one transformer denoising the video and the audio
latents together), ``vae`` (``AutoencoderKLLTX2Video``), ``audio_vae`` (``AutoencoderKLLTX2Audio``, latents to mel
spectrograms), ``vocoder`` (``LTX2Vocoder``, mel spectrograms to a waveform), ``text_encoder``
(``Gemma3ForConditionalGeneration``), ``connectors`` (``LTX2TextConnectors``, Gemma's stacked hidden states to the two
streams' prompt tokens) and ``tokenizer``, loaded from a diffusers-layout repository such as ``Lightricks/LTX-2``.

The computation follows diffusers' ``LTX2Pipeline`` (and, given ``input_images``, ``LTX2ImageToVideoPipeline``) step
for step with its STG, modality-isolation guidance and guidance rescale off: the same noise from a seed (video first,
then audio, from one CPU generator), the release's flow-match Euler schedule on ``linspace(1, 1/N, N)`` shifted by the
video token count, plain classifier-free guidance with one ``cfg_scale`` for both streams (the reference trainer's
sampling), and the VAE and vocoder decoding. The first frame of image-to-video is the image's latents, kept clean
with timestep 0 on its tokens; the transformer predicts no velocity for them. Given ``in_context_videos`` (IC-LoRA)
the computation is ``LTX2InContextPipeline``'s: the reference videos go in as clean tokens next to the video's
(``in_context.py``). The state's token layout is described in ``units.py``.

Audio: the call returns the waveform ``[channels, samples]`` at ``audio_sample_rate`` (the vocoder's rate). Without
an audio VAE and vocoder loaded (the reference's no-audio runs load neither) the audio stream is still denoised, as
the transformer needs it, but not decoded: the call returns ``None`` for it.

Training (``training.py``): a sample's ``video`` and, given ``input_audio``, its sound become ``input_latents`` in the
same token layout; the loss adds the video's and the sound's mean squared errors (``loss_regions``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from ...core.data.cells import integer, positive_integer, real, text
from ...core.data.dataset import is_blank
from ...core.loader import ModelConfig
from ...core.model_traits import register_model_module
from ...diffusion.base_pipeline import BasePipeline
from ...diffusion.flow_match import FlowMatchScheduler
from ..common import ShapeCheckUnit, check_call_inputs, round_size, tensor_to_images
from .in_context import DEFAULT_DOWNSAMPLE_FACTOR, InContextVideoUnit, append_references, reference_token_count
from .media import save_video_with_audio, save_wav
from .training import InputAudioEmbedderUnit, InputVideoEmbedderUnit
from .units import (
    AUDIO_COMPRESSION,
    SCHEDULER_CONFIG,
    FrameCountUnit,
    ImageConditionUnit,
    LatentsUnit,
    NoiseUnit,
    PromptEmbedderUnit,
    round_frames,
    unpack_audio,
    unpack_video,
    with_first_frame,
)

__all__ = ["LTX2AudioVideoPipeline", "ModelConfig"]

logger = logging.getLogger(__name__)

# diffusers keeps the text connectors and the vocoder in the pipeline's package, not at its top level.
register_model_module("diffusers.pipelines.ltx2")

MODEL_ROLES = {
    "LTX2VideoTransformer3DModel": "dit",
    "AutoencoderKLLTX2Video": "vae",
    "AutoencoderKLLTX2Audio": "audio_vae",
    "Gemma3ForConditionalGeneration": "text_encoder",
    "LTX2TextConnectors": "connectors",
    "LTX2Vocoder": "vocoder",
    "LTX2VocoderWithBWE": "vocoder",
}
# diffusers' pipelines refuse sizes that are not multiples of 32.
SIZE_MULTIPLE = 32
# The release's audio latent channels, sample rate and mel hop, for a pipeline loaded without its audio VAE.
RELEASE_AUDIO_LATENT_CHANNELS = 8
RELEASE_AUDIO_SAMPLE_RATE = 16000
RELEASE_AUDIO_HOP_LENGTH = 160
# The frame rate of a training clip whose sample gives none (the reference's default).
DEFAULT_FRAME_RATE = 24.0


class LTX2AudioVideoPipeline(BasePipeline):
    """LTX-2 audio+video generation and the computation its training shares; see the module docstring."""

    model_roles = MODEL_ROLES
    default_torch_dtype = torch.bfloat16
    model_fn_params = ("prompt_emb", "audio_prompt_emb", "prompt_emb_mask", "latent_grid", "audio_frames",
                       "video_tokens", "frame_rate", "first_frame_latents", "trains_audio", "in_context_latents",
                       "in_context_grids", "in_context_downsample_factor")
    latent_patch_size = 1
    maskable_latents = False
    input_types = {
        "seed": integer, "rand_device": text, "num_inference_steps": positive_integer, "cfg_scale": real,
        "max_sequence_length": positive_integer, "height": positive_integer, "width": positive_integer,
        "num_frames": positive_integer, "frame_rate": real, "in_context_downsample_factor": positive_integer,
    }  # fmt: skip
    # The image-condition unit runs next to the video encoder, so the VAE is onloaded once for both; the reference
    # videos are encoded before the noise, whose draw counts their tokens.
    unit_classes = (ShapeCheckUnit, FrameCountUnit, InContextVideoUnit, NoiseUnit, InputVideoEmbedderUnit,
                    ImageConditionUnit, InputAudioEmbedderUnit, LatentsUnit, PromptEmbedderUnit)
    training_columns = ("video", "prompt")
    optional_columns = ("frame_rate",)
    # Image-to-audio+video training may leave the first frame out: it is the video's own (``input_image``, the
    # reference's name in its I2AV scripts, always is).
    derived_inputs = ("input_images", "input_image")
    # A clip without sound leaves its input_audio cell empty: it trains the video alone, also in a batch with sound.
    optional_inputs = ("input_audio",)
    #: Training runs without CFG, its prompts cut as inference cuts them by default.
    training_state = {"cfg_scale": 1, "seed": None, "rand_device": "cpu", "max_sequence_length": 1024}

    def _after_init(self) -> None:
        self.scheduler = FlowMatchScheduler.from_diffusers_config(SCHEDULER_CONFIG)

    # ---- what the loaded models take ------------------------------------------------------------------------------

    def spatial_compression(self) -> int:
        """Pixels per latent pixel side: the video VAE's, else what the transformer was trained with."""
        return self.vae.spatial_compression_ratio if self.vae is not None else self.dit.config.vae_scale_factors[1]

    def temporal_compression(self) -> int:
        """Frames per latent frame (after the first): the video VAE's, else the transformer's."""
        return self.vae.temporal_compression_ratio if self.vae is not None else self.dit.config.vae_scale_factors[0]

    def size_multiple(self) -> int:
        """Heights and widths are rounded to this: a whole number of tokens, and a multiple of 32."""
        # Without the transformer (a stage that only encodes), the releases' patch of 1.
        patch = self.dit.config.patch_size if self.dit is not None else 1
        return math.lcm(SIZE_MULTIPLE, self.spatial_compression() * patch)

    def latent_grid(self, height: int, width: int, num_frames: int) -> tuple[int, int, int]:
        """The video latents' ``(frames, height, width)`` for a video of that size (sizes already rounded)."""
        scale = self.spatial_compression()
        return (num_frames - 1) // self.temporal_compression() + 1, height // scale, width // scale

    def video_latent_channels(self) -> int:
        """The video latents' channels: the VAE's, else the transformer's input's."""
        return self.vae.config.latent_channels if self.vae is not None else self.dit.config.in_channels

    def audio_latent_shape(self) -> tuple[int, int]:
        """The audio latents' ``(channels, mel bins)``: the audio VAE's, else the release's channels and the width of
        the transformer's audio tokens (without it, the video tokens' width: the two streams share one)."""
        if self.audio_vae is not None:
            return self.audio_vae.config.latent_channels, self.audio_vae.config.mel_bins // AUDIO_COMPRESSION
        width = self.dit.config.audio_in_channels if self.dit is not None else self.video_latent_channels()
        if width % RELEASE_AUDIO_LATENT_CHANNELS:
            raise ValueError(f"the transformer's audio tokens have {width} features, not a multiple of the release's "
                             f"{RELEASE_AUDIO_LATENT_CHANNELS} latent channels; load the audio VAE too")
        return RELEASE_AUDIO_LATENT_CHANNELS, width // RELEASE_AUDIO_LATENT_CHANNELS

    def audio_frames(self, num_frames: int, frame_rate: float) -> int:
        """Audio latent frames as long as ``num_frames`` video frames at ``frame_rate``."""
        if self.audio_vae is not None:
            sample_rate, hop = self.audio_vae.config.sample_rate, self.audio_vae.config.mel_hop_length
        elif self.dit is not None:
            sample_rate, hop = self.dit.config.audio_sampling_rate, self.dit.config.audio_hop_length
        else:  # a training stage that encodes the video alone
            sample_rate, hop = RELEASE_AUDIO_SAMPLE_RATE, RELEASE_AUDIO_HOP_LENGTH
        return round(num_frames / frame_rate * sample_rate / hop / AUDIO_COMPRESSION)

    @property
    def audio_sample_rate(self) -> int | None:
        """Samples per second of the waveform the call returns (the vocoder's output rate); None without a vocoder."""
        return None if self.vocoder is None else self.vocoder.config.output_sampling_rate

    def normalise_video(self, latents: torch.Tensor) -> torch.Tensor:
        """Video VAE latents ``(B, C, F, H, W)`` to the transformer's scale (the VAE's per-channel statistics)."""
        mean, std = self._video_statistics(latents)
        return (latents - mean) * self.vae.config.scaling_factor / std

    def _video_statistics(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (1, -1, 1, 1, 1)
        return (self.vae.latents_mean.view(shape).to(like.device, like.dtype),
                self.vae.latents_std.view(shape).to(like.device, like.dtype))

    def set_inference_timesteps(self, num_inference_steps: int, denoising_strength: float = 1.0, *,
                                latent_shape: tuple[int, ...]) -> None:
        """The release's schedule, shifted by the video token count ``latent_shape[1]`` (a ``(batch, video tokens)``
        shape)."""
        self.scheduler.set_timesteps(num_inference_steps, denoising_strength, image_seq_len=latent_shape[1])

    # ---- training -------------------------------------------------------------------------------------------------

    def training_media(self, sample: dict[str, Any]) -> dict[str, Any]:
        """The sample's ``video`` frames as ``input_video`` at their own size and count, at the sample's
        ``frame_rate`` (a metadata column; the trainer's ``--frame_rate`` fills rows without one; 24 without either),
        which sets how much sound the clip holds.

        Raises:
            ValueError: The ``frame_rate`` cell is not a positive number.
        """
        frames, frame_rate = sample["video"], sample.get("frame_rate")
        if is_blank(frame_rate):  # an empty cell, as a row of a CSV whose other rows give their rate
            frame_rate = DEFAULT_FRAME_RATE
        try:
            frame_rate = float(frame_rate)
        except (TypeError, ValueError):
            frame_rate = -1.0
        if not frame_rate > 0:
            raise ValueError(f"the sample's frame_rate is {sample.get('frame_rate')!r}; give the clip's frames per "
                             "second, e.g. 24, or leave the column out for 24")
        return {"input_video": frames, "height": frames[0].height, "width": frames[0].width,
                "num_frames": len(frames), "frame_rate": frame_rate}

    def derived_training_inputs(self, sample: dict[str, Any], extra_inputs: Sequence[str]) -> dict[str, Any]:
        """With ``--extra_inputs input_images`` (image-to-audio+video), the given first frame: the sample's
        ``input_images`` column when it has one (an image, or a list holding one), else the video's first frame; with
        ``input_image`` (the reference's I2AV scripts), the video's first frame.

        Raises:
            ValueError: The column holds a path that was not loaded.
        """
        if "input_image" in extra_inputs and "input_images" not in extra_inputs:
            return {"input_images": [sample["video"][0]]}
        if "input_images" not in extra_inputs:
            return {}
        images = sample.get("input_images")
        if isinstance(images, str) or (isinstance(images, list) and any(isinstance(item, str) for item in images)):
            raise ValueError(f"the input_images column holds the path {images!r}, not an image; add input_images to "
                             "--data_file_keys (e.g. --data_file_keys video,input_images) so it is loaded")
        if images is None:
            images = [sample["video"][0]]
        return {"input_images": images if isinstance(images, list) else [images]}

    def loss_regions(self, inputs_shared: dict) -> tuple[tuple[slice | torch.Tensor, ...] | None, ...]:
        """The video's predicted tokens, and the sound's of the samples with sound: the loss adds their mean squared
        errors (the reference's video loss plus audio loss); in a batch mixing clips with and without sound, the
        sound's region names the samples it scores (``trains_audio``, one flag per sample)."""
        tokens = inputs_shared["video_tokens"]
        video = (slice(None), slice(self._first_predicted_token(inputs_shared), tokens))
        # A bool per sample; a cache written before the flag became a tensor holds a plain bool.
        rows = torch.as_tensor(inputs_shared.get("trains_audio", False)).reshape(-1)
        if not rows.any():
            return (video,)
        return (video, (slice(None) if rows.all() else rows, slice(tokens, None)))

    @staticmethod
    def _first_predicted_token(inputs_shared: dict) -> int:
        """0, or with a given first frame the count of its tokens, which the transformer does not predict."""
        if inputs_shared.get("first_frame_latents") is None:
            return 0
        _, height, width = inputs_shared["latent_grid"]
        return height * width

    # ---- denoising and decoding -----------------------------------------------------------------------------------

    def model_fn(self, latents: torch.Tensor, timestep: torch.Tensor | float, prompt_emb: torch.Tensor,
                 audio_prompt_emb: torch.Tensor, prompt_emb_mask: torch.Tensor, latent_grid: Sequence[int],
                 audio_frames: int, video_tokens: int, frame_rate: float,
                 first_frame_latents: torch.Tensor | None = None, in_context_latents: torch.Tensor | None = None,
                 in_context_grids: Sequence[Sequence[int]] = (),
                 in_context_downsample_factor: int = DEFAULT_DOWNSAMPLE_FACTOR, **_: Any) -> torch.Tensor:
        """The transformer's velocity for the video and audio tokens of ``latents`` at ``timestep`` (scale 0 to 1000),
        in the same layout, in float32.

        With ``first_frame_latents`` the first latent frame's tokens are the image's, at timestep 0, and their
        velocity is zero (diffusers steps only the other frames). With ``in_context_latents`` the reference videos'
        tokens go in after the video's, clean (``in_context.py``); their output is dropped.
        """
        dit, batch, device = self.dit, latents.shape[0], latents.device
        frames, height, width = latent_grid
        sigma = torch.as_tensor(timestep, dtype=torch.float32, device=device).reshape(-1).expand(batch)
        video, audio = latents[:, :video_tokens], latents[:, video_tokens:]
        video_timestep, frame_tokens = sigma, 0
        if first_frame_latents is not None:
            video = with_first_frame(video, first_frame_latents)
            frame_tokens = height * width
            clean = torch.arange(video_tokens, device=device) < frame_tokens
            video_timestep = sigma[:, None] * (~clean).to(sigma.dtype)
        video_coords = dit.rope.prepare_video_coords(batch, frames, height, width, device, fps=frame_rate)
        if in_context_latents is not None:
            video, video_timestep, video_coords = append_references(
                dit, video, video_timestep, video_coords, in_context_latents, in_context_grids,
                in_context_downsample_factor, frame_rate)
        audio_coords = dit.audio_rope.prepare_audio_coords(batch, audio_frames, device)
        video_out, audio_out = dit(
            hidden_states=video.to(dit.dtype), audio_hidden_states=audio.to(dit.dtype),
            encoder_hidden_states=prompt_emb, audio_encoder_hidden_states=audio_prompt_emb,
            timestep=video_timestep, audio_timestep=sigma, sigma=sigma, encoder_attention_mask=prompt_emb_mask,
            audio_encoder_attention_mask=prompt_emb_mask, num_frames=frames, height=height, width=width,
            fps=frame_rate, audio_num_frames=audio_frames, video_coords=video_coords, audio_coords=audio_coords,
            use_cross_timestep=bool(dit.config.cross_attn_mod), return_dict=False,
        )  # fmt: skip
        video_out = video_out[:, :video_tokens].float()
        if frame_tokens:
            video_out = torch.cat([torch.zeros_like(video_out[:, :frame_tokens]), video_out[:, frame_tokens:]], dim=1)
        return torch.cat([video_out, audio_out.float()], dim=1)

    def decode(self, inputs_shared: dict, inputs_posi: dict, inputs_nega: dict
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The final latents as ``(video, audio)``: frames ``(B, F, 3, H, W)`` in ``[0, 1]`` from the video VAE, and
        the vocoder's waveform ``(B, channels, samples)`` (None without the audio VAE and vocoder)."""
        latents, tokens = inputs_shared["latents"], inputs_shared["video_tokens"]
        self.load_models_to_device(["vae"])
        video = unpack_video(latents[:, :tokens], inputs_shared["latent_grid"]).to(self.vae.dtype)
        mean, std = self._video_statistics(video)
        video = video * std / self.vae.config.scaling_factor + mean
        decode_timestep = None
        if self.vae.config.timestep_conditioning:  # diffusers' default: decode at timestep 0 without added noise
            decode_timestep = torch.zeros(video.shape[0], device=video.device, dtype=video.dtype)
        video = self.vae.decode(video, decode_timestep, return_dict=False)[0]
        video = (video / 2 + 0.5).clamp(0, 1).permute(0, 2, 1, 3, 4)
        if self.audio_vae is None or self.vocoder is None:
            logger.warning("no audio VAE and vocoder are loaded, so the audio is not decoded")
            return video, None
        self.load_models_to_device(["audio_vae", "vocoder"])
        audio = latents[:, tokens:].float()
        audio = audio * self.audio_vae.latents_std.to(audio) + self.audio_vae.latents_mean.to(audio)
        mel = self.audio_vae.decode(unpack_audio(audio, self.audio_latent_shape()[1]).to(self.audio_vae.dtype),
                                    return_dict=False)[0]
        return video, self.vocoder(mel.to(self.vocoder.dtype)).float()

    def save_output(self, output: tuple[Sequence[Image.Image], torch.Tensor | None], stem: Path,
                    fps: int = 24) -> Path:
        """Writes ``(frames, waveform)`` as ``<stem>.mp4`` with its sound track, and the sound as ``<stem>.wav``."""
        frames, waveform = output
        path = save_video_with_audio(frames, waveform, stem.with_suffix(".mp4"), fps=fps,
                                     sample_rate=self.audio_sample_rate or 0)
        if waveform is not None:
            save_wav(waveform, stem.with_suffix(".wav"), self.audio_sample_rate)
        return path

    @torch.no_grad()
    def __call__(self, prompt: str, negative_prompt: str = "", cfg_scale: float = 3.0, height: int = 512,
                 width: int = 768, num_frames: int = 121, frame_rate: float = 24.0, seed: int | None = None,
                 rand_device: str = "cpu", num_inference_steps: int = 30,
                 input_images: Sequence[Image.Image] | None = None, image_crf: int | None = None,
                 in_context_videos: Sequence[Sequence[Image.Image]] | None = None,
                 in_context_downsample_factor: int = DEFAULT_DOWNSAMPLE_FACTOR, max_sequence_length: int = 1024, output_type: str = "pil", progress_bar: bool = True,
                 ) -> tuple[list[Image.Image] | torch.Tensor, torch.Tensor | None]:
        """Generates one video and its sound.

        Args:
            prompt: What to show and hear.
            negative_prompt: What to steer away from; used when ``cfg_scale`` is not 1.
            cfg_scale: Classifier-free guidance scale of both streams; 1 turns CFG off and halves the work per step.
            height: Frame height in pixels, rounded to a multiple of ``size_multiple()`` (32 for the releases).
            width: Frame width in pixels, rounded likewise.
            num_frames: Frame count, rounded down to the form 8k+1.
            frame_rate: Frames per second: sets the sound's length and the video's time positions.
            seed: Noise seed (the noise diffusers draws from a CPU generator with this seed); None draws from torch's
                global generator.
            rand_device: Device the noise is drawn on.
            num_inference_steps: Denoising steps.
            input_images: ``[image]``, the first frame (image-to-audio+video); resized to ``height x width``.
            image_crf: The H.264 CRF the first frame is recompressed with before encoding; None: 33, the training
                videos' compression; 0 skips it.
            in_context_videos: Reference videos for an IC-LoRA, each a list of frames: cut to ``num_frames``, made
                ``height / in_context_downsample_factor x width / in_context_downsample_factor`` and given to the
                transformer as clean tokens next to the video's.
            in_context_downsample_factor: How much smaller than the video the references are given (the IC-LoRA's
                training factor; 2 for the released ones).
            max_sequence_length: Prompt tokens the text encoder sees (padded to this length).
            output_type: ``"pil"`` for a list of frames, ``"pt"`` for a ``(1, frames, 3, H, W)`` tensor in ``[0, 1]``.
            progress_bar: Show a progress bar over the steps.

        Returns:
            ``(video, audio)``: the frames, and the waveform ``[channels, samples]`` at ``audio_sample_rate`` (None
            without an audio VAE and vocoder).
        """
        check_call_inputs(prompt, output_type)
        inputs_shared = {
            "cfg_scale": cfg_scale, "height": height, "width": width, "num_frames": num_frames,
            "frame_rate": frame_rate, "seed": seed, "rand_device": rand_device, "input_images": input_images,
            "image_crf": image_crf, "max_sequence_length": max_sequence_length,
            "in_context_videos": in_context_videos, "in_context_downsample_factor": in_context_downsample_factor,
        }  # fmt: skip
        # The schedule shifts by the video (and reference) token count, known once the sizes are rounded as the units
        # round them; the references are checked here, before any work.
        multiple = self.size_multiple()
        size = (round_size(height, multiple), round_size(width, multiple),
                round_frames(num_frames, self.temporal_compression()))
        grid = self.latent_grid(*size)
        references = reference_token_count(self, in_context_videos, *size, in_context_downsample_factor)
        self.set_inference_timesteps(num_inference_steps, latent_shape=(1, grid[0] * grid[1] * grid[2] + references))
        video, audio = self.denoise(inputs_shared, {"prompt": prompt}, {"negative_prompt": negative_prompt},
                                    progress_bar=progress_bar)
        frames = video if output_type == "pt" else tensor_to_images(video[0])
        return frames, None if audio is None else audio[0]
