"""LTX-2 training: the clean latents of a clip with and without sound, the release's log-mel spectrogram, the loss
(video plus audio, as the reference), and LoRA names as LTX-2's own code and diffusers' converter read them."""

import numpy as np
import pytest
import torch
from PIL import Image

from diffsynth.pipelines.ltx2.naming import NAMING
from diffsynth.pipelines.ltx2.training import clip_waveform, fit_frames, log_mel_spectrogram
from diffsynth.pipelines.ltx2.units import pack_audio
from diffsynth.training.objective.loss import FlowMatchSFTLoss
from tests.pipelines.family_helpers import load_ours

RATE = 16000


@pytest.fixture(scope="module")
def pipe(tiny_root):
    return load_ours(tiny_root, "ltx2")


def clip(seed=0, count=5):
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(count)]


def tone(pitch, seconds=0.5, rate=RATE, channels=2):
    time = torch.arange(round(seconds * rate)) / rate
    return (0.3 * torch.sin(2 * torch.pi * pitch * time)).repeat(channels, 1)


def state(pipe, sound=None, frame_rate=25.0, video=None):
    sample = {"video": video or clip(), "prompt": "a bell", "frame_rate": frame_rate}
    shared, posi, nega = pipe.training_inputs({**sample, "input_audio": sound}, ["input_audio"])
    return pipe.run_units(shared, posi, nega)


def test_log_mel_equals_an_independent_spectrogram():
    from transformers.audio_utils import mel_filter_bank, spectrogram, window_function

    waveform = tone(440.0, channels=1) + 0.05 * torch.randn(1, RATE // 2, generator=torch.Generator().manual_seed(0))
    ours = log_mel_spectrogram(waveform, RATE, mel_bins=64, hop_length=160)
    filters = mel_filter_bank(513, 64, 0.0, RATE / 2, RATE, norm="slaney", mel_scale="slaney")
    reference = spectrogram(waveform[0].numpy(), window_function(1024, "hann"), 1024, 160, power=1.0,
                            mel_filters=filters, mel_floor=1e-5, log_mel="log")
    assert ours.shape == (1, reference.shape[1], 64)
    assert np.abs(ours[0].numpy() - reference.T).max() < 1e-3
    other = log_mel_spectrogram(tone(880.0, channels=1), RATE, mel_bins=64, hop_length=160)
    assert (other - ours).abs().max() > 1


def test_clips_are_cut_or_padded_with_silence_and_latents_fitted():
    waveform = torch.ones(2, 100)
    assert torch.equal(clip_waveform(waveform, 100, 0.5), torch.ones(2, 50))
    padded = clip_waveform(waveform, 100, 1.5)
    assert padded.shape == (2, 150) and padded[:, 100:].abs().max() == 0
    latents = torch.arange(12.0).reshape(1, 1, 3, 4)
    assert torch.equal(fit_frames(latents, 2), latents[:, :, :2])
    assert torch.equal(fit_frames(latents, 5)[:, :, 3:], latents[:, :, 2:].expand(-1, -1, 2, -1))


def test_a_clip_with_sound_holds_its_audio_latents_after_the_video(pipe):
    shared, _, _ = state(pipe, (tone(440.0), RATE))
    tokens, frames = shared["video_tokens"], shared["audio_frames"]
    assert shared["trains_audio"].tolist() == [True]
    assert shared["input_latents"].shape == (1, tokens + frames, 8)
    # Independent of the unit: the sound's first 5 / 25 s, its mel spectrogram, the audio VAE's mode, normalised.
    waveform = tone(440.0)[:, :round(5 / 25 * RATE)]
    config = pipe.audio_vae.config
    mel = log_mel_spectrogram(waveform, RATE, config.mel_bins, config.mel_hop_length).unsqueeze(0)
    latents = pack_audio(fit_frames(pipe.audio_vae.encode(mel).latent_dist.mode(), frames))
    expected = (latents - pipe.audio_vae.latents_mean) / pipe.audio_vae.latents_std
    assert torch.allclose(shared["input_latents"][:, tokens:], expected, atol=1e-5)
    # Teeth: another pitch moves the audio latents, not the video's.
    other, _, _ = state(pipe, (tone(1500.0), RATE))
    assert (other["input_latents"][:, tokens:] - expected).abs().max() > 1e-2
    assert torch.equal(other["input_latents"][:, :tokens], shared["input_latents"][:, :tokens])


def test_sound_at_another_rate_and_in_mono_is_resampled_to_the_same_latents(pipe):
    stereo, _, _ = state(pipe, (tone(440.0), RATE))
    mono_8k, _, _ = state(pipe, (tone(440.0, rate=8000, channels=1), 8000))
    tokens = stereo["video_tokens"]
    difference = (stereo["input_latents"][:, tokens:] - mono_8k["input_latents"][:, tokens:]).abs().max()
    assert difference < 0.1  # a resampler's filtering, far below what another pitch moves (above)


def test_without_sound_the_audio_tokens_are_zero_and_untrained(pipe):
    shared, _, _ = state(pipe)
    tokens = shared["video_tokens"]
    assert shared["trains_audio"].tolist() == [False] and shared["input_latents"][:, tokens:].abs().max() == 0
    assert pipe.loss_regions(shared) == ((slice(None), slice(0, tokens)),)


def test_a_bad_frame_rate_and_an_unloaded_sound_are_refused(pipe):
    with pytest.raises(ValueError, match="frame_rate is 'fast'"):
        state(pipe, frame_rate="fast")
    with pytest.raises(ValueError, match="--data_file_keys"):
        state(pipe, "clip.wav")


class Recorder:
    """Wraps ``model_fn`` to keep the last prediction."""

    def __init__(self, pipe):
        self.pipe, self.model_fn = pipe, pipe.model_fn

    def __call__(self, **inputs):
        self.prediction = self.model_fn(**inputs)
        return self.prediction


def loss_and_parts(pipe, shared, posi, nega):
    """The loss with a fixed generator, and the video and audio mean squared errors computed here."""
    recorder = Recorder(pipe)
    loss_fn = FlowMatchSFTLoss()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pipe, "model_fn", recorder)
        loss = loss_fn(pipe, shared, posi, nega, generator=torch.Generator().manual_seed(1))
    generator = torch.Generator().manual_seed(1)
    timestep, weight = loss_fn.sampling.draw(pipe.scheduler, shared["input_latents"].shape, generator)
    noise = torch.randn(shared["input_latents"].shape, generator=generator)
    target = pipe.scheduler.training_target(shared["input_latents"], noise, timestep)
    tokens = shared["video_tokens"]
    errors = [((recorder.prediction[:, part] - target[:, part]) ** 2).mean() * weight
              for part in (slice(0, tokens), slice(tokens, None))]
    return loss, errors


def test_the_loss_adds_the_videos_and_the_sounds_errors(pipe):
    with torch.no_grad():
        loss, (video, audio) = loss_and_parts(pipe, *state(pipe, (tone(440.0), RATE)))
        silent_loss, (silent_video, _) = loss_and_parts(pipe, *state(pipe))
    assert torch.allclose(loss, video + audio, rtol=1e-5) and audio > 1e-3
    assert torch.allclose(silent_loss, silent_video, rtol=1e-5)


def test_a_batch_mixing_clips_with_and_without_sound_scores_each_as_alone(pipe):
    from diffsynth.training.objective.batches import collate_states

    loss_fn = FlowMatchSFTLoss()
    # The silent row as the dataset gives it: its empty input_audio cell is no key at all.
    silent = pipe.run_units(*pipe.training_inputs({"video": clip(1), "prompt": "a door", "frame_rate": 25.0},
                                                  ["input_audio"]))
    states = [state(pipe, (tone(440.0), RATE)), silent]
    batch = collate_states(states, loss_fn.state_keys(pipe), pipe.padded_inputs)
    assert batch[0]["trains_audio"].tolist() == [True, False]

    def generators():
        return [torch.Generator().manual_seed(seed) for seed in (1, 2)]

    with torch.no_grad():
        together = loss_fn.per_sample(pipe, *batch, generators=generators())
        alone = torch.cat([loss_fn.per_sample(pipe, *one, generators=[generator])
                           for one, generator in zip(states, generators())])
        # Teeth: scoring the silent clip's (zero) sound as well moves its loss.
        scored = loss_fn.per_sample(pipe, {**batch[0], "trains_audio": torch.tensor([True, True])}, *batch[1:],
                                    generators=generators())
    assert torch.allclose(together, alone, rtol=1e-5)
    assert torch.allclose(loss_fn(pipe, *batch, generators=generators()), alone.mean(), rtol=1e-5)
    assert scored[1] - alone[1] > 1e-2 * alone[1] and torch.allclose(scored[0], alone[0], rtol=1e-5)


def test_lora_names_are_ltx2s_and_diffusers_converts_them_back(pipe):
    from diffusers.loaders.lora_conversion_utils import _convert_non_diffusers_ltx2_lora_to_diffusers

    names = [name for name, module in pipe.dit.named_modules() if isinstance(module, torch.nn.Linear)]
    native = {name: NAMING.to_native(name) for name in names}
    assert None not in native.values(), [name for name, value in native.items() if value is None]
    assert native["proj_in"] == "patchify_proj" and native["time_embed.linear"] == "adaln_single.linear"
    assert native["transformer_blocks.1.audio_to_video_attn.to_q"] == "transformer_blocks.1.audio_to_video_attn.to_q"
    converted = _convert_non_diffusers_ltx2_lora_to_diffusers(
        {f"diffusion_model.{value}.lora_A.weight": torch.zeros(1) for value in native.values()})
    assert sorted(converted) == sorted(f"transformer.{name}.lora_A.weight" for name in names)
    assert all(NAMING.to_diffusers(value) == name for name, value in native.items())


def test_image_to_audio_video_training_gives_the_first_frame_and_scores_the_rest(pipe):
    video = clip(3)
    sample = {"video": video, "prompt": "a bell", "input_audio": (tone(440.0), RATE)}
    shared, posi, _ = pipe.run_units(*pipe.training_inputs(sample, ["input_audio", "input_images"]))
    plain, _, _ = pipe.run_units(*pipe.training_inputs(sample, ["input_audio"]))
    _, height, width = shared["latent_grid"]
    tokens, frame = shared["video_tokens"], height * width
    assert shared["first_frame_latents"].shape == (1, 8, 1, height, width)
    assert torch.equal(shared["input_latents"], plain["input_latents"])  # the clean clip is the same
    assert pipe.loss_regions(shared) == ((slice(None), slice(frame, tokens)), (slice(None), slice(tokens, None)))
    # The first frame is given: its tokens are the image's whatever the noise, and no velocity is predicted for them.
    with torch.no_grad():
        prediction = pipe.model_fn(**{**shared, **posi, "latents": torch.randn_like(shared["input_latents"]),
                                      "timestep": torch.tensor([500.0])})
    assert prediction[:, :frame].abs().max() == 0 and prediction[:, frame:tokens].abs().max() > 0
    # Another first frame (its own column) changes the condition.
    other, _, _ = pipe.run_units(*pipe.training_inputs({**sample, "input_images": clip(4)[0]},
                                                       ["input_audio", "input_images"]))
    assert (other["first_frame_latents"] - shared["first_frame_latents"]).abs().max() > 1e-2
    with pytest.raises(ValueError, match="--data_file_keys"):
        pipe.training_inputs({**sample, "input_images": "first.png"}, ["input_images"])
