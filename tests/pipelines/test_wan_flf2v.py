"""Wan first-last-frame conditioning: Wan2.1-FLF2V (CLIP tokens of both images, with learned positions) and the Fun
InP models (the last frame in ``y``, CLIP of the first image only), against diffusers' ``WanImageToVideoPipeline``
with ``last_image`` on the same tiny weights; the FLF2V original layout; the training inputs and the errors."""

import types

import pytest
import torch
from PIL import Image

from diffsynth.core.loader import ModelConfig
from diffsynth.pipelines.wan_video.image import condition_mask
from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
from diffsynth.testing.tiny_models import WAN_I2V_MODEL_ID, WAN_I2V_PATTERNS, WAN_SCHEDULER_CONFIG
from diffsynth.testing.tiny_wan_flf2v import WAN_FLF2V_MODEL_ID, WAN_FLF2V_PATTERNS, tiny_flf2v_transformer

from .test_wan_i2v import NEGATIVE, PROMPT, SIZE, configs, picture, reference_schedule

FLF2V_MODELS = ("dit", "text_encoder", "vae", "image_encoder")


def diffusers_twin(ours):
    """diffusers' image-to-video pipeline on our pipeline's own models, with the repos' UniPC scheduler."""
    import diffusers.pipelines.wan.pipeline_wan_i2v as reference_module
    from diffusers import UniPCMultistepScheduler, WanImageToVideoPipeline

    if not hasattr(reference_module, "ftfy"):  # its prompt cleaning calls ftfy unguarded; ours skips it when missing
        reference_module.ftfy = types.SimpleNamespace(fix_text=lambda text: text)
    theirs = WanImageToVideoPipeline(
        tokenizer=ours.tokenizer, text_encoder=ours.text_encoder, vae=ours.vae, image_processor=ours.image_processor,
        image_encoder=ours.image_encoder, transformer=ours.dit,
        scheduler=UniPCMultistepScheduler.from_config(WAN_SCHEDULER_CONFIG))  # fmt: skip
    theirs.set_progress_bar_config(disable=True)
    return theirs


@pytest.fixture(scope="module")
def flf2v(tiny_root):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        ours = WanVideoPipeline.from_pretrained(torch.float32, "cpu",
                                                configs(WAN_FLF2V_MODEL_ID, WAN_FLF2V_PATTERNS, *FLF2V_MODELS))
    return ours, diffusers_twin(ours)


@pytest.fixture(scope="module")
def fun_inp(tiny_root):
    """A Wan2.1 image-to-video transformer with CLIP and no image positions: the shape of the Fun InP models."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        ours = WanVideoPipeline.from_pretrained(torch.float32, "cpu",
                                                configs(WAN_I2V_MODEL_ID, WAN_I2V_PATTERNS, *FLF2V_MODELS))
    return ours, diffusers_twin(ours)


def render(pipe, cfg_scale, end_image, first=0):
    return pipe(PROMPT, negative_prompt=NEGATIVE, cfg_scale=cfg_scale, input_image=picture(first),
                end_image=end_image, seed=7, output_type="pt", progress_bar=False, **SIZE)


def reference(theirs, cfg_scale, end_image):
    return theirs(image=picture(0), last_image=end_image, prompt=PROMPT, negative_prompt=NEGATIVE,
                  guidance_scale=cfg_scale, generator=torch.Generator().manual_seed(7), output_type="pt", **SIZE).frames


def test_the_flf2v_release_loads_with_its_image_positions(flf2v):
    ours, _ = flf2v
    assert ours.takes_two_images() and ours.dit.config.pos_embed_seq_len == 34  # two images of 16 patches + class
    expected = tiny_flf2v_transformer(0).condition_embedder.image_embedder.pos_embed
    assert torch.equal(ours.dit.condition_embedder.image_embedder.pos_embed, expected) and expected.abs().sum() > 0


def test_flf2v_matches_diffusers_with_last_image(flf2v, cfg_scale=4.0):
    # With CFG both branches run; test_wan_i2v covers cfg_scale=1 on the same code.
    ours, theirs = flf2v
    with reference_schedule(ours, theirs):
        video = render(ours, cfg_scale, picture(5))
        other_end = render(ours, cfg_scale, picture(6))
    expected = reference(theirs, cfg_scale, picture(5))
    assert video.shape == expected.shape == (1, 5, 3, 32, 48)
    assert (video - expected).abs().max() < 1e-4
    assert (other_end - expected).abs().max() > 1e-2  # the last frame really steers the video


def test_flf2v_reads_both_images_clip_tokens_in_order(flf2v):
    ours, _ = flf2v
    shared, posi, _ = ours.run_units({**SIZE, "seed": 0, "input_image": picture(0), "end_image": picture(5)},
                                     {"prompt": PROMPT}, {})
    clip_feature = shared["clip_feature"]
    assert clip_feature.shape == (1, 34, 32)
    inputs = dict(latents=shared["latents"], timestep=torch.tensor(500.0), prompt_emb=posi["prompt_emb"],
                  y=shared["y"])
    swapped = torch.cat([clip_feature[:, 17:], clip_feature[:, :17]], dim=1)
    assert (ours.model_fn(**inputs, clip_feature=clip_feature)
            - ours.model_fn(**inputs, clip_feature=swapped)).abs().max() > 1e-4  # the positions tell them apart
    # One image's tokens (what a split run's first stage without the transformer caches) are refused by name.
    with pytest.raises(ValueError, match="reads 34 CLIP tokens .*got 17: the cache of a --task sft:data_process run"):
        ours.model_fn(**inputs, clip_feature=clip_feature[:, :17])


def test_fun_inp_matches_diffusers_with_last_image_and_first_image_clip(fun_inp, monkeypatch, cfg_scale=4.0):
    ours, theirs = fun_inp
    with reference_schedule(ours, theirs):
        video = render(ours, cfg_scale, picture(5))
        no_end = render(ours, cfg_scale, None)
    # The Fun InP models read the first image's CLIP tokens only (the reference's forward); diffusers encodes both
    # images for its last_image (and refuses image_embeds beside an image), so its encoder sees the first one only.
    encode = theirs.encode_image
    monkeypatch.setattr(theirs, "encode_image", lambda images, device: encode(images[0], device))
    expected = reference(theirs, cfg_scale, picture(5))
    assert (video - expected).abs().max() < 1e-4
    # The last frame's mask and latents steer the video. (Through the tiny VAE two noise pictures as the last of
    # four folded frames give latents only 0.004 apart, so the check is against no last frame at all.)
    assert (no_end - expected).abs().max() > 1e-2


def test_the_mask_marks_the_first_and_the_last_pixel_frame():
    mask = condition_mask(9, True, (1, 16, 3, 2, 2))
    assert mask.shape == (1, 4, 3, 2, 2)
    assert mask[0, :, :, 0, 0].tolist() == [[1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 1]]
    assert condition_mask(9, False, (1, 16, 3, 2, 2))[0, :, :, 0, 0].sum() == 4


def test_training_takes_the_last_frame_as_end_image(flf2v, fun_inp):
    frames = [picture(i, (48, 32)) for i in range(5)]
    shared, _, _ = flf2v[0].training_inputs({"video": frames, "prompt": PROMPT})
    assert shared["input_image"] is frames[0] and shared["end_image"] is frames[-1]  # FLF2V needs both
    shared, _, _ = fun_inp[0].training_inputs({"video": frames, "prompt": PROMPT})
    assert shared["end_image"] is None  # a Fun InP model takes it when --extra_inputs names it
    shared, _, _ = fun_inp[0].training_inputs({"video": frames, "prompt": PROMPT}, ["input_image", "end_image"])
    assert shared["end_image"] is frames[-1]
    with pytest.raises(ValueError, match="add end_image to --data_file_keys"):
        fun_inp[0].training_inputs({"video": frames, "prompt": PROMPT, "end_image": "last.png"}, ["end_image"])


def test_a_missing_or_unusable_end_image_is_refused(flf2v, base):
    ours, _ = flf2v
    with pytest.raises(ValueError, match="first-last-frame model .* pass end_image="):
        ours(PROMPT, cfg_scale=1.0, input_image=picture(0), seed=0, progress_bar=False, **SIZE)
    with pytest.raises(TypeError, match="end_image must be one PIL image"):
        ours(PROMPT, cfg_scale=1.0, input_image=picture(0), end_image="last.png", seed=0, progress_bar=False, **SIZE)
    assert ours.sample_input_problems({"input_image"}) == [
        f'{ours.describe_transformer()} is a first-last-frame model: give an "end_image"']
    from diffsynth.testing.tiny_models import WAN_MODEL_ID, WAN_PATTERNS

    text_only = WanVideoPipeline.from_pretrained(torch.float32, "cpu", [ModelConfig(
        model_id=WAN_MODEL_ID, origin_file_pattern=WAN_PATTERNS["dit"])])
    with pytest.raises(ValueError, match="end_image was given, but the transformer .* takes no last frame"):
        text_only.run_units({**SIZE, "end_image": picture(5)}, {"prompt": PROMPT}, {})
    assert Image  # PIL is the input type the errors name
