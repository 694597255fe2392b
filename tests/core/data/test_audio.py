"""Sound columns: a sound file or a video's own track read with PyAV, clear refusals, resampling and stereo."""

import numpy as np
import pytest
import torch

from diffsynth.core.data import UnifiedDataset
from diffsynth.core.data.audio import load_audio, resample, to_stereo
from diffsynth.core.data.errors import DatasetError
from diffsynth.core.data.example_dataset import SOUND_RATE, build_example_video_dataset
from diffsynth.core.data.operators import AUDIO_OPERATOR, VIDEO_OPERATOR, operator_for


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("av")
    build_example_video_dataset(folder, num_videos=2, num_frames=9, audio=True)
    return folder


def dominant_frequency(channel: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(channel))
    return float(np.fft.rfftfreq(len(channel), 1 / rate)[spectrum.argmax()])


def test_a_wav_reads_back_as_written(clips):
    waveform, rate = load_audio(clips / "audio_001.wav")
    assert rate == SOUND_RATE and waveform.shape == (2, round(9 / 16 * SOUND_RATE)) and waveform.dtype == torch.float32
    # Two tones, one per channel: each channel holds its own pitch.
    pitches = [dominant_frequency(channel, rate) for channel in waveform.numpy()]
    assert all(220 <= pitch <= 880 for pitch in pitches) and abs(pitches[0] - pitches[1]) > 1


def test_a_video_column_gives_its_sound_track_and_a_silent_one_is_refused(clips):
    waveform, rate = load_audio(clips / "video_000.mp4")
    assert rate == SOUND_RATE and waveform.shape[0] == 2 and waveform.shape[1] >= 9 / 16 * SOUND_RATE
    assert 0.3 < float(waveform.abs().max()) < 0.6  # the AAC round trip of a 0.4 sine
    with pytest.raises(DatasetError, match="holds no sound track"):
        load_audio(clips / "video_001.mp4")


def test_the_input_audio_column_is_read_as_sound_whatever_the_extension(clips):
    assert operator_for(clips / "video_000.mp4", "input_audio") is AUDIO_OPERATOR
    assert operator_for(clips / "video_000.mp4", "video") is VIDEO_OPERATOR
    dataset = UnifiedDataset(clips, clips / "metadata.csv", data_file_keys=("video", "input_audio"), height=32,
                             width=32, num_frames=9)
    first, second = dataset[0], dataset[1]
    assert len(first["video"]) == 9 and isinstance(first["input_audio"], tuple)
    assert first["input_audio"][0].shape[0] == 2 and second["input_audio"][1] == SOUND_RATE


def test_resampling_keeps_the_pitch_and_the_length():
    rate, seconds = 8000, 0.5
    time = np.arange(int(rate * seconds)) / rate
    tone = torch.from_numpy(np.stack([np.sin(2 * np.pi * 440 * time)] * 2).astype(np.float32))
    upsampled = resample(tone, rate, 16000)
    assert abs(upsampled.shape[1] - 16000 * seconds) <= 64
    assert abs(dominant_frequency(upsampled[0].numpy(), 16000) - 440) < 4
    assert torch.equal(resample(tone, rate, rate), tone)
    with pytest.raises(ValueError, match="takes 1 or 2"):
        resample(torch.zeros(3, 100), rate, 16000)


def test_stereo_doubles_mono_and_keeps_the_front_pair():
    mono = torch.arange(4.0).reshape(1, 4)
    assert torch.equal(to_stereo(mono), torch.cat([mono, mono]))
    surround = torch.arange(24.0).reshape(6, 4)
    assert torch.equal(to_stereo(surround), surround[:2])
