"""Media for LTX-2: the H.264 recompression of a conditioning image, and writing a waveform as ``.wav`` or as the
sound track of an ``.mp4`` (PyAV; torchaudio is not used).

Waveforms are ``[channels, samples]`` float tensors in ``[-1, 1]`` (what the vocoder returns for one video).
"""

from __future__ import annotations

import io
import wave
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ...core.files import atomic_write
from ..common import mux_video_frames

# AAC's bit rate per channel for the sound track of an .mp4.
AAC_BIT_RATE_PER_CHANNEL = 96_000


def recompress_image(image: Image.Image, crf: int) -> Image.Image:
    """``image`` after one round trip through H.264 at ``crf`` (libx264, preset veryfast, yuv420p), cropped to even
    sides: the compression the LTX-2 models saw on the first frames of their training videos.

    Raises:
        ValueError: ``crf`` is not in 1..51.
    """
    import av

    if not isinstance(crf, int) or not 1 <= crf <= 51:
        raise ValueError(f"image_crf={crf!r} must be an H.264 CRF in 1..51 (33 by default), or 0 to skip it")
    pixels = np.asarray(image.convert("RGB"))
    pixels = pixels[: pixels.shape[0] // 2 * 2, : pixels.shape[1] // 2 * 2]
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=1, options={"crf": str(crf), "preset": "veryfast"})
        stream.height, stream.width = pixels.shape[:2]
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="rgb24").reformat(format="yuv420p")
        container.mux(stream.encode(frame))
        container.mux(stream.encode())
    buffer.seek(0)
    with av.open(buffer) as container:
        decoded = next(container.decode(video=0))
    return Image.fromarray(decoded.to_ndarray(format="rgb24"))


def _waveform_array(waveform: torch.Tensor | np.ndarray) -> np.ndarray:
    """A ``[channels, samples]`` float32 array clipped to ``[-1, 1]``.

    Raises:
        ValueError: Not two-dimensional, or more channels than samples (a transposed waveform).
    """
    array = waveform.detach().float().cpu().numpy() if isinstance(waveform, torch.Tensor) else np.asarray(waveform)
    if array.ndim != 2 or array.shape[0] > array.shape[1]:
        raise ValueError(f"the waveform has shape {tuple(array.shape)}; pass [channels, samples], e.g. the audio a "
                         "pipeline call returns")
    return np.clip(array.astype(np.float32), -1.0, 1.0)


def save_wav(waveform: torch.Tensor | np.ndarray, path: str | Path, sample_rate: int) -> Path:
    """Writes a ``[channels, samples]`` waveform in ``[-1, 1]`` as 16-bit PCM ``.wav``, atomically."""
    array = _waveform_array(waveform)
    samples = np.round(array.T * 32767.0).astype("<i2")

    def write(temporary: Path) -> None:
        with wave.open(str(temporary), "wb") as file:
            file.setnchannels(array.shape[0])
            file.setsampwidth(2)
            file.setframerate(int(sample_rate))
            file.writeframes(samples.tobytes())

    return atomic_write(Path(path), write)


def save_video_with_audio(frames: Sequence[Image.Image], waveform: torch.Tensor | np.ndarray | None,
                          path: str | Path, fps: float, sample_rate: int, quality: int = 8) -> Path:
    """Writes frames as an ``.mp4`` (H.264, see ``mux_video_frames``) with ``waveform`` (``[channels, samples]``, one
    or two channels) as its AAC sound track; without a waveform, the video alone. Written atomically.

    Raises:
        ValueError: ``path`` does not end in ``.mp4``, or the waveform's shape is wrong.
    """
    path = Path(path)
    if path.suffix.lower() != ".mp4":
        raise ValueError(f"save_video_with_audio: {path} must end in .mp4")
    array = None if waveform is None else _waveform_array(waveform)
    if array is not None and array.shape[0] not in (1, 2):
        raise ValueError(f"the waveform has {array.shape[0]} channels; the sound track takes 1 or 2")

    def write(temporary: Path) -> None:
        import av

        with av.open(str(temporary), mode="w", format="mp4") as container:
            audio = None
            if array is not None:
                audio = container.add_stream("aac", rate=int(sample_rate))
                audio.layout = "stereo" if array.shape[0] == 2 else "mono"
                audio.bit_rate = AAC_BIT_RATE_PER_CHANNEL * array.shape[0]
            mux_video_frames(container, list(frames), fps, quality)
            if audio is not None:
                frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(array), format="fltp", layout=audio.layout)
                frame.sample_rate = int(sample_rate)
                container.mux(audio.encode(frame))
                container.mux(audio.encode())

    return atomic_write(path, write)
