"""LTX-2 IC-LoRA: reference videos in context, equal to diffusers' ``LTX2InContextPipeline`` on the tiny repo (frames
and waveform, with and without CFG, at downsample factors 1 and 2), checks with teeth, the reference tokens kept out
of the state, and the refusals of bad references."""

import numpy as np
import pytest
import torch
from PIL import Image

from diffsynth.pipelines.ltx2.in_context import as_video_list
from tests.pipelines.family_helpers import load_ours, load_theirs
from tests.pipelines.test_ltx2 import NEGATIVE, PLAIN_GUIDANCE, PROMPT, SHAPE, distance

# The bound in float32, for frames and waveform (measured: below 3e-6 and 1e-7).
TOLERANCE = 5e-4
AUDIO_TOLERANCE = 1e-6
# Another reference video (flat white instead of noise) must move the output by far more (measured: the frames by
# 1e-2 to 7e-2, the waveform by 4e-4 to 2e-3; no reference at all moves the frames by 0.7).
TEETH = 10 * TOLERANCE
AUDIO_TEETH = 20 * AUDIO_TOLERANCE


@pytest.fixture(scope="module")
def ours(tiny_root):
    return load_ours(tiny_root, "ltx2")


@pytest.fixture(scope="module")
def theirs(tiny_root):
    from diffusers import LTX2InContextPipeline

    return load_theirs(tiny_root, LTX2InContextPipeline, "Lightricks/LTX-2")


def white(size: int = 16, count: int = 5) -> list[Image.Image]:
    return [Image.new("RGB", (size, size), (255, 255, 255))] * count


def reference(seed: int, size: int = 16, count: int = 5) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)) for _ in range(count)]


def render_ours(pipe, videos, factor=2, cfg_scale=3.0, seed=7):
    return pipe(PROMPT, negative_prompt=NEGATIVE, cfg_scale=cfg_scale, seed=seed, output_type="pt",
                progress_bar=False, in_context_videos=videos, in_context_downsample_factor=factor, **SHAPE)


def render_theirs(pipe, videos, factor=2, cfg_scale=3.0, seed=7):
    from diffusers.pipelines.ltx2.pipeline_ltx2_ic_lora import LTX2ReferenceCondition

    out = pipe(prompt=PROMPT, negative_prompt=NEGATIVE, guidance_scale=cfg_scale, audio_guidance_scale=cfg_scale,
               reference_conditions=[LTX2ReferenceCondition(frames=video) for video in videos],
               reference_downscale_factor=factor, generator=torch.Generator().manual_seed(seed), output_type="pt",
               **PLAIN_GUIDANCE, **SHAPE)
    return out.frames, out.audio[0]


@pytest.mark.parametrize(("factor", "cfg_scale", "count"), [(2, 3.0, 1), (2, 1.0, 1), (1, 3.0, 2)])
def test_in_context_generation_matches_diffusers(ours, theirs, factor, cfg_scale, count):
    videos = [reference(index, size=32 // factor) for index in range(count)]
    video, audio = render_ours(ours, videos, factor, cfg_scale)
    expected = render_theirs(theirs, videos, factor, cfg_scale)
    assert video.shape == expected[0].shape == (1, 5, 3, 32, 32) and audio.shape == expected[1].shape
    frames, waveform = distance((video, audio), expected)
    assert frames < TOLERANCE and waveform < AUDIO_TOLERANCE, (frames, waveform)
    other = render_ours(ours, [white(32 // factor) for _ in range(count)], factor, cfg_scale)
    frames, waveform = distance(other, expected)
    assert frames > TEETH and waveform > AUDIO_TEETH, (frames, waveform)


def test_references_stay_out_of_the_state_and_are_cut_and_padded(ours):
    """The state's latents hold the video and the sound alone; a longer reference is cut to the clip and a shorter
    one padded with black frames to the VAE's frame grid (5 frames at the tiny VAE's 2x temporal compression)."""
    captured = {}
    decode = ours.decode

    def keep(inputs_shared, inputs_posi, inputs_nega):
        captured.update(inputs_shared)
        return decode(inputs_shared, inputs_posi, inputs_nega)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ours, "decode", keep)
        ours(PROMPT, seed=1, progress_bar=False, output_type="pt", in_context_videos=[reference(0, count=9)],
             **{**SHAPE, "num_inference_steps": 1})
        long_tokens = captured["in_context_latents"]
        ours(PROMPT, seed=1, progress_bar=False, output_type="pt", in_context_videos=[reference(0, count=4)],
             **{**SHAPE, "num_inference_steps": 1})
    assert captured["latents"].shape[1] == captured["video_tokens"] + captured["audio_frames"]
    assert captured["in_context_grids"] == ((3, 8, 8),) and long_tokens.shape == (1, 3 * 8 * 8, 8)
    # Independent of the unit: the first 5 frames of the long reference, encoded and normalised.
    from diffsynth.pipelines.common import video_to_tensor

    latents = ours.normalise_video(ours.vae.encode(video_to_tensor(reference(0, count=9)[:5])).latent_dist.mode())
    assert torch.allclose(long_tokens, latents.flatten(2).transpose(1, 2), atol=1e-5)
    padded = ours.normalise_video(ours.vae.encode(
        video_to_tensor(reference(0, count=4) + [Image.new("RGB", (16, 16))])).latent_dist.mode())
    assert torch.allclose(captured["in_context_latents"], padded.flatten(2).transpose(1, 2), atol=1e-5)


def test_one_video_is_taken_as_a_list_of_one():
    video = reference(0)
    assert as_video_list(video) == [video] and as_video_list([video, video]) == [video, video]
    assert as_video_list(None) is None and as_video_list([]) is None


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"in_context_downsample_factor": 3}, r"in_context_downsample_factor=3 does not fit a 32x32 clip"),
    ({"in_context_downsample_factor": 0}, r"in_context_downsample_factor=0 does not fit"),
    ({"in_context_downsample_factor": 1.5}, r"in_context_downsample_factor=1.5 does not fit"),
    ({"in_context_videos": ["ref.mp4"]}, r"holds the path \['ref.mp4'\], not a loaded video; add in_context_videos"),
    ({"in_context_videos": Image.new("RGB", (16, 16))}, r"in_context_videos is Image; pass a list of reference"),
])
def test_bad_references_are_refused_before_any_work(ours, kwargs, message):
    call = {**SHAPE, "num_inference_steps": 1, "in_context_videos": [reference(0)], **kwargs}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ours, "run_units", lambda *_: pytest.fail("the units ran"))
        with pytest.raises(ValueError, match=message):
            ours(PROMPT, progress_bar=False, **call)


def test_training_keeps_the_references_out_of_the_latents_and_the_loss(ours):
    """A training sample's clean latents and loss regions are those of a plain clip; the references only change the
    transformer's prediction for the clip's tokens."""
    sample = {"video": reference(5, size=32), "prompt": "a bell", "frame_rate": 25.0,
              "in_context_videos": reference(0), "in_context_downsample_factor": 2}
    extra = ["in_context_videos", "in_context_downsample_factor"]
    shared, posi, _ = ours.run_units(*ours.training_inputs(sample, extra))
    plain, _, _ = ours.run_units(*ours.training_inputs(sample, []))
    assert torch.equal(shared["input_latents"], plain["input_latents"])
    assert ours.loss_regions(shared) == ours.loss_regions(plain)
    noisy = {"latents": torch.randn_like(shared["input_latents"]), "timestep": torch.tensor([500.0])}
    with torch.no_grad():
        conditioned = ours.model_fn(**{**shared, **posi, **noisy})
        unconditioned = ours.model_fn(**{**plain, **posi, **noisy})
    assert conditioned.shape == shared["input_latents"].shape
    assert (conditioned - unconditioned).abs().max() > 1e-3
