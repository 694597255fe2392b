"""LTX-2 training: a sample's video and sound as the clean latents the loss regresses, and which tokens it scores.

The state's ``input_latents`` use the token layout of ``units.py``: the video's normalised latents, then the sound's.
The sound (``input_audio``: ``(waveform, sample_rate)``, a sound file or a video's own track, see
``core.data.audio``) is cut to the clip (``num_frames / frame_rate`` seconds from its start, silence-padded when
shorter), made stereo, resampled to the audio VAE's rate, turned into a log-mel spectrogram as the LTX-2 release's
audio processing does (Hann-windowed STFT magnitudes, ``n_fft`` 1024, the VAE's hop, Slaney mel filters up to half
the rate, ``log(max(mel, 1e-5))``), encoded (the distribution's mode, so a cached latent equals a one-stage run's),
fitted to the clip's ``audio_frames`` latent frames and normalised with the VAE's statistics.

Without sound (a ``video,prompt`` dataset, the reference's no-audio runs, which load no audio VAE, or a row of a
``video,prompt,input_audio`` dataset whose ``input_audio`` cell is empty) the audio tokens are zeros and the loss
scores the video alone, so the audio stream seen by the transformer is the noise the loss adds at the drawn timestep.
With sound the loss is the reference's: the video's mean squared error plus the audio's, at one timestep
(``LTX2AudioVideoPipeline.loss_regions``). A batch may mix clips with and without sound: each sample's loss is what
it would be alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from PIL import Image

from ...core.data.audio import resample, to_stereo
from ...diffusion.base_pipeline import PipelineUnit
from ..common import video_to_tensor
from .units import pack_audio, pack_video

if TYPE_CHECKING:
    from .pipeline import LTX2AudioVideoPipeline

# The LTX-2 release's STFT size for the audio VAE's mel spectrograms.
MEL_FFT_SIZE = 1024
# log(mel) is taken of magnitudes floored here.
MEL_FLOOR = 1e-5


def log_mel_spectrogram(waveform: torch.Tensor, sample_rate: int, mel_bins: int, hop_length: int,
                        n_fft: int = MEL_FFT_SIZE) -> torch.Tensor:
    """The log-mel spectrogram ``(channels, frames, mel_bins)`` of a ``[channels, samples]`` waveform (float32):
    centred, reflect-padded Hann STFT magnitudes through Slaney-normalised Slaney-scale mel filters from 0 Hz to
    half ``sample_rate``, logged after flooring at ``MEL_FLOOR``."""
    from transformers.audio_utils import mel_filter_bank

    filters = torch.from_numpy(mel_filter_bank(n_fft // 2 + 1, mel_bins, 0.0, sample_rate / 2, sample_rate,
                                               norm="slaney", mel_scale="slaney")).float()
    window = torch.hann_window(n_fft, device=waveform.device)
    spectrum = torch.stft(waveform.float(), n_fft, hop_length, n_fft, window, center=True, pad_mode="reflect",
                          return_complex=True).abs()
    mel = torch.einsum("fm,cft->ctm", filters.to(spectrum.device), spectrum)
    return torch.log(mel.clamp(min=MEL_FLOOR))


def clip_waveform(waveform: torch.Tensor, sample_rate: int, seconds: float) -> torch.Tensor:
    """The first ``seconds`` of a ``[channels, samples]`` waveform, padded with silence where it is shorter."""
    samples = round(seconds * sample_rate)
    clipped = waveform[:, :samples]
    return torch.nn.functional.pad(clipped, (0, samples - clipped.shape[1]))


def fit_frames(latents: torch.Tensor, frames: int) -> torch.Tensor:
    """Audio latents ``(B, C, L, M)`` cut or extended (repeating the last frame) to ``frames`` frames: the encoder's
    length may differ from the clip's by one."""
    if latents.shape[2] >= frames:
        return latents[:, :, :frames]
    return torch.cat([latents, latents[:, :, -1:].expand(-1, -1, frames - latents.shape[2], -1)], dim=2)


class InputVideoEmbedderUnit(PipelineUnit):
    """Encodes ``input_video`` (its first ``num_frames`` frames, resized to ``height x width``) with the video VAE
    into normalised video tokens ``video_input_latents`` ``(1, F * H * W, C)``; the VAE's mode, not a sample."""

    def __init__(self) -> None:
        super().__init__(input_params=("input_video", "height", "width", "num_frames"),
                         output_params=("video_input_latents",), onload_model_names=("vae",))

    def process(self, pipe: LTX2AudioVideoPipeline, input_video: Sequence[Image.Image] | None, height: int,
                width: int, num_frames: int) -> dict:
        if input_video is None:
            return {}
        if len(input_video) < num_frames:
            raise ValueError(f"input_video has {len(input_video)} frames, fewer than num_frames={num_frames}; pass a "
                             "longer video or fewer frames (--num_frames)")
        frames = [frame if frame.size == (width, height) else frame.resize((width, height), Image.Resampling.LANCZOS)
                  for frame in input_video[:num_frames]]
        latents = pipe.vae.encode(video_to_tensor(frames).to(pipe.device, pipe.vae.dtype)).latent_dist.mode()
        return {"video_input_latents": pack_video(pipe.normalise_video(latents)).to(pipe.torch_dtype)}


class InputAudioEmbedderUnit(PipelineUnit):
    """Appends the sound's tokens to the video's as ``input_latents`` (zeros without ``input_audio``) and says in
    ``trains_audio`` (a ``(1,)`` bool tensor, which a batch joins into one flag per sample) whether the loss scores
    them; see the module docstring."""

    def __init__(self) -> None:
        super().__init__(input_params=("video_input_latents", "input_audio", "num_frames", "frame_rate",
                                       "audio_frames"),
                         output_params=("input_latents", "trains_audio"), onload_model_names=("audio_vae",))

    def process(self, pipe: LTX2AudioVideoPipeline, video_input_latents: torch.Tensor | None,
                input_audio: tuple[torch.Tensor, int] | None, num_frames: int, frame_rate: float,
                audio_frames: int) -> dict:
        if video_input_latents is None:
            return {}
        if input_audio is None:
            silence = video_input_latents.new_zeros(video_input_latents.shape[0], audio_frames,
                                                    video_input_latents.shape[2])
            return {"input_latents": torch.cat([video_input_latents, silence], dim=1),
                    "trains_audio": torch.tensor([False])}
        audio = self.encode(pipe, input_audio, num_frames / frame_rate, audio_frames)
        return {"input_latents": torch.cat([video_input_latents, audio.to(video_input_latents)], dim=1),
                "trains_audio": torch.tensor([True])}

    @staticmethod
    def encode(pipe: LTX2AudioVideoPipeline, input_audio: tuple[torch.Tensor, int], seconds: float,
               audio_frames: int) -> torch.Tensor:
        """The sound's normalised tokens ``(1, audio_frames, C * M)``.

        Raises:
            ValueError: No audio VAE is loaded, or ``input_audio`` is not a ``(waveform, sample_rate)`` pair.
        """
        if pipe.audio_vae is None:
            raise ValueError("the samples give input_audio, but no audio VAE is loaded to encode it; add "
                             "'Lightricks/LTX-2:audio_vae/diffusion_pytorch_model.safetensors' to the model configs, "
                             "or drop input_audio from --extra_inputs to train the video alone")
        if not (isinstance(input_audio, tuple) and len(input_audio) == 2 and torch.is_tensor(input_audio[0])):
            raise ValueError(f"input_audio is {type(input_audio).__name__}, not a loaded sound; add input_audio to "
                             "--data_file_keys (e.g. --data_file_keys video,input_audio) so its file is read")
        waveform, rate = input_audio
        config = pipe.audio_vae.config
        waveform = resample(to_stereo(clip_waveform(waveform, rate, seconds)), rate, config.sample_rate)
        waveform = clip_waveform(waveform, config.sample_rate, seconds)
        mel = log_mel_spectrogram(waveform, config.sample_rate, config.mel_bins, config.mel_hop_length)
        mel = mel.unsqueeze(0).to(pipe.device, pipe.audio_vae.dtype)
        latents = fit_frames(pipe.audio_vae.encode(mel).latent_dist.mode(), audio_frames)
        tokens = pack_audio(latents).float()
        mean, std = pipe.audio_vae.latents_mean.to(tokens), pipe.audio_vae.latents_std.to(tokens)
        return ((tokens - mean) / std).to(pipe.torch_dtype)

