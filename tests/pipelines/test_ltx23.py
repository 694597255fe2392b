"""LTX-2.3 (gated attention, timestep-modulated prompt attention, per-stream text connectors, the BWE vocoder): output
parity with diffusers' ``LTX2Pipeline``, ``LTX2ImageToVideoPipeline`` and ``LTX2InContextPipeline`` on the tiny
``diffusers/LTX-2.3-Diffusers`` (frames and the 48 kHz waveform), checks with teeth, and the sound written at the
extender's rate."""

import wave

import av
import pytest
import torch

from diffsynth.core.loader import ModelConfig
from diffsynth.pipelines import LTX2AudioVideoPipeline
from diffsynth.testing.tiny_ltx23 import LTX23_MODEL_ID, LTX23_PATTERNS, VOCODER_INPUT_RATE, VOCODER_OUTPUT_RATE
from tests.pipelines.test_ltx2 import NEGATIVE, PROMPT, SHAPE, SLOTS, assert_moved, assert_same, picture
from tests.pipelines.test_ltx2_in_context import reference, white

# diffusers' guidance extras off, as for LTX-2; the cross-modal timestep is LTX-2.3's (diffusers' default, and what
# our pipeline picks from the transformer's cross_attn_mod).
PLAIN_GUIDANCE = dict(stg_scale=0.0, modality_scale=1.0, guidance_rescale=0.0, audio_stg_scale=0.0,
                      audio_modality_scale=1.0, audio_guidance_rescale=0.0, spatio_temporal_guidance_blocks=None,
                      use_cross_timestep=True)
# The tolerances and teeth are LTX-2's (tests/pipelines/test_ltx2.py); measured on 2.3: frames below 1e-6, the
# waveform below 3e-7; a seed moves them by 0.8 and 0.1, a prompt by 0.1 and 1e-2.


def load_ours(tiny_root, slots=SLOTS):
    configs = [ModelConfig(model_id=LTX23_MODEL_ID, origin_file_pattern=LTX23_PATTERNS[slot]) for slot in slots]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        return LTX2AudioVideoPipeline.from_pretrained(torch.float32, "cpu", configs)


@pytest.fixture(scope="module")
def ours(tiny_root):
    return load_ours(tiny_root)


@pytest.fixture(scope="module")
def theirs(tiny_root):
    from diffusers import LTX2ImageToVideoPipeline, LTX2InContextPipeline, LTX2Pipeline

    pipes = {}
    for name, cls in (("t2v", LTX2Pipeline), ("i2v", LTX2ImageToVideoPipeline), ("ic", LTX2InContextPipeline)):
        pipes[name] = cls.from_pretrained(str(tiny_root / LTX23_MODEL_ID), dtype=torch.float32)
        pipes[name].set_progress_bar_config(disable=True)
    return pipes


def render_ours(pipe, seed=7, prompt=PROMPT, cfg_scale=3.0, **kwargs):
    return pipe(prompt, negative_prompt=NEGATIVE, cfg_scale=cfg_scale, seed=seed, output_type="pt",
                progress_bar=False, **SHAPE, **kwargs)


def render_theirs(pipe, seed=7, cfg_scale=3.0, **kwargs):
    out = pipe(prompt=PROMPT, negative_prompt=NEGATIVE, guidance_scale=cfg_scale, audio_guidance_scale=cfg_scale,
               generator=torch.Generator().manual_seed(seed), output_type="pt", **PLAIN_GUIDANCE, **SHAPE, **kwargs)
    return out.frames, out.audio[0]


def test_the_tiny_release_has_every_ltx23_switch_on(ours):
    dit, connectors = ours.dit.config, ours.connectors.config
    assert dit.gated_attn and dit.audio_gated_attn and dit.cross_attn_mod and dit.audio_cross_attn_mod
    assert not dit.use_prompt_embeddings and dit.perturbed_attn
    assert connectors.per_modality_projections and connectors.video_gated_attn and connectors.audio_gated_attn
    assert connectors.video_connector_num_learnable_registers and connectors.audio_connector_num_learnable_registers
    assert type(ours.vocoder).__name__ == "LTX2VocoderWithBWE"


@pytest.mark.parametrize("cfg_scale", [3.0, 1.0])
def test_text_to_audio_video_matches_diffusers(ours, theirs, cfg_scale):
    video, audio = render_ours(ours, cfg_scale=cfg_scale)
    expected = render_theirs(theirs["t2v"], cfg_scale=cfg_scale)
    assert video.shape == expected[0].shape == (1, 5, 3, 32, 32) and audio.shape == expected[1].shape
    assert_same((video, audio), expected)
    assert_moved(render_ours(ours, seed=8, cfg_scale=cfg_scale), expected)
    assert_moved(render_ours(ours, prompt="a cat singing on a roof", cfg_scale=cfg_scale), expected)


def test_image_to_audio_video_matches_diffusers(ours, theirs):
    video, audio = render_ours(ours, input_images=[picture(0)])
    expected = render_theirs(theirs["i2v"], image=picture(0))
    assert_same((video, audio), expected)
    assert_moved(render_ours(ours, input_images=[picture(1)]), expected)


def test_in_context_generation_matches_diffusers(ours, theirs):
    from diffusers.pipelines.ltx2.pipeline_ltx2_ic_lora import LTX2ReferenceCondition

    videos = [reference(0)]
    video, audio = render_ours(ours, in_context_videos=videos, in_context_downsample_factor=2)
    expected = render_theirs(theirs["ic"], reference_conditions=[LTX2ReferenceCondition(frames=videos[0])],
                             reference_downscale_factor=2)
    assert_same((video, audio), expected)
    assert_moved(render_ours(ours, in_context_videos=[white()], in_context_downsample_factor=2), expected)


def test_the_sound_is_the_extenders_48_khz_and_written_at_that_rate(ours, tmp_path):
    frames, audio = ours(PROMPT, seed=1, progress_bar=False, **{**SHAPE, "num_inference_steps": 1})
    assert ours.audio_sample_rate == VOCODER_OUTPUT_RATE == 3 * VOCODER_INPUT_RATE
    # the extender triples the first vocoder's samples: 4 per mel frame, 4 mel frames per latent frame
    audio_frames = ours.audio_frames(SHAPE["num_frames"], SHAPE["frame_rate"])
    assert audio.shape == (2, 3 * 4 * (4 * audio_frames - 3))
    path = ours.save_output((frames, audio), tmp_path / "clip")
    with wave.open(str(tmp_path / "clip.wav")) as sound:
        assert sound.getframerate() == VOCODER_OUTPUT_RATE and sound.getnframes() == audio.shape[1]
    with av.open(str(path)) as container:
        assert container.streams.audio[0].rate == VOCODER_OUTPUT_RATE
