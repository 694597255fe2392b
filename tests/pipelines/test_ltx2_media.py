"""LTX-2's media helpers: the first frame's H.264 recompression equals diffusers' own, and a waveform written as
``.wav`` and as an ``.mp4``'s sound track reads back (wave, PyAV)."""

import wave

import av
import numpy as np
import pytest
import torch
from PIL import Image

from diffsynth.pipelines.ltx2.media import recompress_image, save_video_with_audio, save_wav

RATE = 16000


def tone(seconds=0.5, channels=2) -> torch.Tensor:
    """A 440 Hz sine per channel (the second an octave up), ``[channels, samples]`` at ``RATE``, amplitude 0.5."""
    time = torch.arange(int(seconds * RATE)) / RATE
    return torch.stack([0.5 * torch.sin(2 * torch.pi * 440 * (index + 1) * time) for index in range(channels)])


def frames(count=12, size=(32, 32)) -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (*size[::-1], 3), dtype=np.uint8)) for _ in range(count)]


@pytest.mark.parametrize("crf", [33, 18])
def test_recompression_equals_diffusers(crf):
    from diffusers.pipelines.ltx2.utils import apply_image_conditioning_crf

    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (34, 46, 3), dtype=np.uint8))
    ours = np.asarray(recompress_image(image, crf))
    assert np.array_equal(ours, apply_image_conditioning_crf(np.asarray(image), crf))
    assert np.abs(ours.astype(int) - np.asarray(image).astype(int)).max() > 10  # it did compress


def test_wav_reads_back(tmp_path):
    waveform = tone()
    path = save_wav(waveform, tmp_path / "sound.wav", RATE)
    with wave.open(str(path)) as file:
        assert (file.getnchannels(), file.getsampwidth(), file.getframerate()) == (2, 2, RATE)
        data = np.frombuffer(file.readframes(file.getnframes()), dtype="<i2").reshape(-1, 2).T / 32767.0
    assert data.shape == tuple(waveform.shape)
    assert np.abs(data - waveform.numpy()).max() < 1 / 32767


def test_mp4_carries_the_sound_track(tmp_path):
    waveform, pictures = tone(seconds=0.5), frames(12)
    path = save_video_with_audio(pictures, waveform, tmp_path / "clip.mp4", fps=24, sample_rate=RATE)
    with av.open(str(path)) as container:
        video = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        assert (stream.codec_context.name, stream.rate, stream.channels) == ("aac", RATE, 2)
        sound = np.concatenate([frame.to_ndarray() for frame in container.decode(audio=0)], axis=1)
    assert len(video) == 12 and video[0].shape == (32, 32, 3)
    # AAC adds a priming delay and is lossy: the decoded tone has the same pitch and loudness per channel.
    assert sound.shape[0] == 2 and sound.shape[1] >= waveform.shape[1]
    for channel, expected in zip(sound, waveform.numpy()):
        middle = channel[2048:2048 + 4096]
        assert abs(np.sqrt(np.mean(middle**2)) - np.sqrt(np.mean(expected**2))) < 0.05
        spectrum = np.abs(np.fft.rfft(middle))
        peak_hz = np.argmax(spectrum) * RATE / len(middle)
        target = np.abs(np.fft.rfft(expected[:4096]))
        assert abs(peak_hz - np.argmax(target) * RATE / 4096) < 10


def test_mp4_without_sound_and_bad_waveforms(tmp_path):
    path = save_video_with_audio(frames(4), None, tmp_path / "silent.mp4", fps=24, sample_rate=RATE)
    with av.open(str(path)) as container:
        assert len(container.streams.audio) == 0 and len(container.streams.video) == 1
    with pytest.raises(ValueError, match=r"pass \[channels, samples\]"):
        save_wav(tone().T, tmp_path / "transposed.wav", RATE)
    with pytest.raises(ValueError, match="must end in .mp4"):
        save_video_with_audio(frames(4), tone(), tmp_path / "clip.gif", fps=24, sample_rate=RATE)
    with pytest.raises(ValueError, match="image_crf=0 must be an H.264 CRF"):
        recompress_image(frames(1)[0], 0)
