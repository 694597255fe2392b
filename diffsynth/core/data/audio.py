"""Sound files, and the sound tracks of videos, read with PyAV (torchaudio is not used).

A column the dataset loads as audio (``AUDIO_COLUMNS``, whatever the file's extension, so a video may name itself)
gives ``(waveform, sample_rate)``: a float32 ``[channels, samples]`` tensor in ``[-1, 1]`` at the file's own rate,
the whole track. The pipeline that reads it cuts it to its clip and resamples it to its model's rate (``resample``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import DatasetError

#: Metadata columns whose files are read as sound, not as images or video frames.
AUDIO_COLUMNS = ("input_audio",)
_LAYOUTS = {1: "mono", 2: "stereo"}


def _audio_stream(container: Any, path: Path) -> Any:
    stream = next((stream for stream in container.streams if stream.type == "audio"), None)
    if stream is None:
        raise DatasetError(f"{path} holds no sound track; name a file with sound (a video with its audio, or a "
                           ".wav/.mp3/.flac), or leave the row's audio out")
    return stream


def check_audio(path: Path, resize: Any = None) -> int:
    """Fails on a file without a readable sound track (reading only its header); returns 0 pixels to decode.

    Raises:
        DatasetError: PyAV cannot open it, or it holds no sound track.
    """
    import av

    try:
        with av.open(str(path)) as container:
            _audio_stream(container, path)
    except av.FFmpegError as error:
        raise DatasetError(f"{path} is not a media file PyAV reads ({error})") from None
    return 0


def load_audio(path: Path, resize: Any = None) -> tuple[torch.Tensor, int]:
    """The file's first sound track as ``(waveform [channels, samples] float32, sample_rate)``.

    Raises:
        DatasetError: It cannot be read, or holds no sound track or no samples.
    """
    import av

    try:
        with av.open(str(path)) as container:
            stream = _audio_stream(container, path)
            # Every sample format decodes to planar float32, channels kept.
            resampler = av.AudioResampler(format="fltp")
            chunks = [out.to_ndarray() for frame in container.decode(stream) for out in resampler.resample(frame)]
            chunks += [out.to_ndarray() for out in resampler.resample(None)]
            rate = stream.rate or stream.codec_context.sample_rate
    except av.FFmpegError as error:
        raise DatasetError(f"{path}: its sound track does not decode ({error})") from None
    if not chunks or not sum(chunk.shape[1] for chunk in chunks):
        raise DatasetError(f"{path}: its sound track holds no samples")
    return torch.from_numpy(np.concatenate(chunks, axis=1).astype(np.float32)), int(rate)


def to_stereo(waveform: torch.Tensor) -> torch.Tensor:
    """A ``[channels, samples]`` waveform with two channels: mono doubled, more than two cut to the first two (the
    front left and right of the usual layouts)."""
    if waveform.shape[0] == 1:
        return waveform.expand(2, -1)
    return waveform[:2]


def resample(waveform: torch.Tensor, sample_rate: int, target_rate: int) -> torch.Tensor:
    """A ``[channels, samples]`` waveform (one or two channels) at ``target_rate`` (PyAV's resampler), float32."""
    if sample_rate == target_rate:
        return waveform.float()
    import av

    array = np.ascontiguousarray(waveform.detach().float().cpu().numpy())
    layout = _LAYOUTS.get(array.shape[0])
    if layout is None:
        raise ValueError(f"the waveform has {array.shape[0]} channels; resample takes 1 or 2 (use to_stereo)")
    frame = av.AudioFrame.from_ndarray(array, format="fltp", layout=layout)
    frame.sample_rate = int(sample_rate)
    resampler = av.AudioResampler(format="fltp", layout=layout, rate=int(target_rate))
    chunks = [out.to_ndarray() for out in (*resampler.resample(frame), *resampler.resample(None))]
    return torch.from_numpy(np.concatenate(chunks, axis=1).astype(np.float32))
