"""LTX-2: output parity with diffusers' ``LTX2Pipeline`` and ``LTX2ImageToVideoPipeline`` on the tiny repo (frames and
the audio waveform, with and without CFG, with the first frame's H.264 recompression and without), checks with teeth,
the no-audio mode, the call's output and its refusals of bad input."""

import numpy as np
import pytest
import torch
from PIL import Image

from diffsynth.core.loader import ModelConfig
from diffsynth.pipelines import LTX2AudioVideoPipeline
from diffsynth.testing.tiny_ltx2 import LTX2_MODEL_ID, LTX2_PATTERNS

PROMPT, NEGATIVE = "a robot dancing", "blurry"
# 32 x 32 pixels and 5 frames at 25 fps: 3 x 16 x 16 video tokens and 5 audio tokens on the tiny repo.
SHAPE = dict(height=32, width=32, num_frames=5, frame_rate=25.0, num_inference_steps=3, max_sequence_length=16)
# The bound for frames and waveform in float32 is 5e-4; measured: below 2e-6 (frames) and 1e-7 (waveform).
# The waveform is held to a tighter bound: the tiny vocoder damps what a prompt changes in it to about 1e-4.
TOLERANCE = 5e-4
AUDIO_TOLERANCE = 1e-6
# Another seed, prompt or image must move the output by far more than the tolerance (measured: a seed moves the
# frames by about 1 and the waveform by 1e-2; a prompt the frames by 1e-2 and the waveform by 1e-4; another first
# frame, which reaches the sound only through the audio-video attention, the waveform by 4e-5).
TEETH = 10 * TOLERANCE
AUDIO_TEETH = 20 * AUDIO_TOLERANCE
# diffusers' guidance extras off: its STG, modality isolation and rescale, which the reference does not sample with.
PLAIN_GUIDANCE = dict(stg_scale=0.0, modality_scale=1.0, guidance_rescale=0.0, audio_stg_scale=0.0,
                      audio_modality_scale=1.0, audio_guidance_rescale=0.0, spatio_temporal_guidance_blocks=None,
                      use_cross_timestep=False)
AUDIO_SLOTS = ("audio_vae", "vocoder")
SLOTS = ("dit", "text_encoder", "connectors", "vae", *AUDIO_SLOTS)


def load_ours(tiny_root, slots=SLOTS):
    configs = [ModelConfig(model_id=LTX2_MODEL_ID, origin_file_pattern=LTX2_PATTERNS[slot]) for slot in slots]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        return LTX2AudioVideoPipeline.from_pretrained(torch.float32, "cpu", configs)


@pytest.fixture(scope="module")
def ours(tiny_root):
    return load_ours(tiny_root)


@pytest.fixture(scope="module")
def theirs(tiny_root):
    from diffusers import LTX2ImageToVideoPipeline, LTX2Pipeline

    pipes = {}
    for name, cls in (("t2v", LTX2Pipeline), ("i2v", LTX2ImageToVideoPipeline)):
        pipes[name] = cls.from_pretrained(str(tiny_root / LTX2_MODEL_ID), dtype=torch.float32)
        pipes[name].set_progress_bar_config(disable=True)
    return pipes


def picture(seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8))


def render_ours(pipe, seed=7, prompt=PROMPT, cfg_scale=3.0, **kwargs):
    return pipe(prompt, negative_prompt=NEGATIVE, cfg_scale=cfg_scale, seed=seed, output_type="pt",
                progress_bar=False, **SHAPE, **kwargs)


def render_theirs(pipe, seed=7, prompt=PROMPT, cfg_scale=3.0, **kwargs):
    out = pipe(prompt=prompt, negative_prompt=NEGATIVE, guidance_scale=cfg_scale, audio_guidance_scale=cfg_scale,
               generator=torch.Generator().manual_seed(seed), output_type="pt", **PLAIN_GUIDANCE, **SHAPE, **kwargs)
    return out.frames, out.audio[0]


def distance(first, second) -> tuple[float, float]:
    """The largest difference of the frames and of the waveforms of two ``(video, audio)`` outputs."""
    return tuple(float((a - b).abs().max()) for a, b in zip(first, second))


def assert_same(ours, reference) -> None:
    frames, waveform = distance(ours, reference)
    assert frames < TOLERANCE and waveform < AUDIO_TOLERANCE, (frames, waveform)


def assert_moved(other, reference) -> None:
    frames, waveform = distance(other, reference)
    assert frames > TEETH and waveform > AUDIO_TEETH, (frames, waveform)


@pytest.mark.parametrize("cfg_scale", [3.0, 1.0])
def test_text_to_audio_video_matches_diffusers(ours, theirs, cfg_scale):
    video, audio = render_ours(ours, cfg_scale=cfg_scale)
    reference = render_theirs(theirs["t2v"], cfg_scale=cfg_scale)
    assert video.shape == reference[0].shape == (1, 5, 3, 32, 32)
    assert audio.shape == reference[1].shape and audio.shape[0] == ours.vocoder.config.out_channels
    assert_same((video, audio), reference)
    assert_moved(render_ours(ours, seed=8, cfg_scale=cfg_scale), reference)
    assert_moved(render_ours(ours, prompt="a cat singing on a roof", cfg_scale=cfg_scale), reference)


@pytest.mark.parametrize("image_crf", [None, 0])
def test_image_to_audio_video_matches_diffusers(ours, theirs, image_crf):
    video, audio = render_ours(ours, input_images=[picture(0)], image_crf=image_crf)
    reference = render_theirs(theirs["i2v"], image=picture(0), image_crf=image_crf)
    assert_same((video, audio), reference)
    assert_moved(render_ours(ours, input_images=[picture(1)], image_crf=image_crf), reference)
    assert_moved(render_ours(ours), reference)  # text-to-video with the same seed


def test_first_frame_stays_the_images_latents(ours):
    """The image's latent frame is not denoised: the state's first frame after the loop is the encoded image."""
    captured = {}
    decode = ours.decode

    def keep(inputs_shared, inputs_posi, inputs_nega):
        captured.update(inputs_shared)
        return decode(inputs_shared, inputs_posi, inputs_nega)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ours, "decode", keep)
        render_ours(ours, input_images=[picture(0)])
    frame = captured["first_frame_latents"].flatten(2).transpose(1, 2)
    assert torch.equal(captured["latents"][:, :frame.shape[1]], frame)


def test_default_output_is_frames_and_a_waveform_at_the_vocoders_rate(ours):
    frames, audio = ours(PROMPT, seed=1, progress_bar=False, **SHAPE)
    assert len(frames) == 5 and all(isinstance(f, Image.Image) and f.size == (32, 32) for f in frames)
    assert audio.ndim == 2 and audio.shape[0] == 2 and audio.dtype == torch.float32
    assert ours.audio_sample_rate == ours.vocoder.config.output_sampling_rate == 16000


def test_without_audio_decoders_the_video_is_the_same_and_no_audio_is_returned(tiny_root, ours):
    silent = load_ours(tiny_root, slots=("dit", "text_encoder", "connectors", "vae"))
    video, audio = render_ours(silent)
    assert audio is None and silent.audio_sample_rate is None
    assert torch.equal(video, render_ours(ours)[0])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"input_images": picture(0)}, "input_images takes a list of images"),
    ({"input_images": [picture(0), picture(1)]}, "it takes one PIL image"),
    ({"input_images": [picture(0)], "image_crf": 60}, "image_crf=60 must be an H.264 CRF"),
    ({"num_frames": 0}, r"num_frames=0 must be a positive frame count of the form 2k\+1"),
    ({"frame_rate": 0}, "frame_rate=0 must be a positive number"),
])
def test_bad_input_is_refused_with_the_fix(ours, kwargs, message):
    call = {**SHAPE, "num_inference_steps": 1, **kwargs}
    with pytest.raises(ValueError, match=message):
        ours(PROMPT, progress_bar=False, **call)


def test_frame_count_is_rounded_to_the_vaes_grid(ours, caplog):
    frames, _ = ours(PROMPT, seed=1, progress_bar=False, **{**SHAPE, "num_frames": 6, "num_inference_steps": 1})
    assert len(frames) == 5 and "num_frames=6 is not of the form 2k+1; using 5" in caplog.text
