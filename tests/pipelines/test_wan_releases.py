"""Wan from the original release layouts: the Wan2.1 image-to-video layout generates what its diffusers twin does;
Wan2.2 TI2V-5B (first-frame latents, per-token timesteps, the 16x VAE) and the A14B experts equal diffusers'
pipelines given the same models; size rounding; the first-frame loss."""

import logging
import types

import numpy as np
import pytest
import torch
from PIL import Image

from diffsynth.core.loader import ModelConfig
from diffsynth.testing.tiny_models import (WAN22_A14B_PATTERNS, WAN22_I2V_MODEL_ID, WAN22_T2V_MODEL_ID,
                                               WAN22_TI2V_MODEL_ID, WAN22_TI2V_PATTERNS, WAN_I2V_MODEL_ID,
                                               WAN_I2V_ORIGINAL_MODEL_ID, WAN_I2V_ORIGINAL_PATTERNS, WAN_I2V_PATTERNS,
                                               WAN_SCHEDULER_CONFIG)
from diffsynth.diffusion.flow_match import DiffusersScheduler
from diffsynth.training.objective.loss import FlowMatchSFTLoss
from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline

PROMPT, NEGATIVE = "a red ball rolling", "static, blurry"


def picture(seed, size=(56, 40)):
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def load(model_id, patterns, *names):
    models = [ModelConfig(model_id=model_id, origin_file_pattern=patterns[name]) for name in names]
    return WanVideoPipeline.from_pretrained(torch.float32, "cpu", models)


def unipc():
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler.from_config(WAN_SCHEDULER_CONFIG)


def ours_with_unipc(pipe, **kwargs):
    own = pipe.scheduler
    pipe.scheduler = DiffusersScheduler(unipc())
    try:
        return pipe(PROMPT, negative_prompt=NEGATIVE, output_type="pt", progress_bar=False, **kwargs)
    finally:
        pipe.scheduler = own


@pytest.fixture(scope="module")
def without_ftfy():
    """diffusers' prompt cleaning calls ftfy unguarded; ours skips it when ftfy is missing (the identity here)."""
    import diffusers.pipelines.wan.pipeline_wan as t2v_module
    import diffusers.pipelines.wan.pipeline_wan_i2v as i2v_module

    with pytest.MonkeyPatch.context() as patch:
        for module in (t2v_module, i2v_module):
            if not hasattr(module, "ftfy"):
                patch.setattr(module, "ftfy", types.SimpleNamespace(fix_text=lambda text: text), raising=False)
        yield


@pytest.fixture(scope="module")
def ti2v(tiny_root, without_ftfy):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        return load(WAN22_TI2V_MODEL_ID, WAN22_TI2V_PATTERNS, "dit", "text_encoder", "vae")


SIZE = dict(height=64, width=96, num_frames=5, num_inference_steps=3, cfg_scale=4.0)


def test_the_original_i2v_layout_generates_what_its_diffusers_twin_does(base):
    names = ("dit", "text_encoder", "vae", "image_encoder")
    original = load(WAN_I2V_ORIGINAL_MODEL_ID, WAN_I2V_ORIGINAL_PATTERNS, *names)
    twin = load(WAN_I2V_MODEL_ID, WAN_I2V_PATTERNS, *names)
    # google/umt5-xxl/ beside the T5 file; the CLIP preprocessing the diffusers repository ships, built in code
    assert original.model_configs["tokenizer"].origin_file_pattern == "google/umt5-xxl/"
    assert original.image_processor.to_dict() == twin.image_processor.to_dict()
    kwargs = dict(input_image=picture(0), cfg_scale=3.0, height=32, width=48, num_frames=5, num_inference_steps=2,
                  seed=4, output_type="pt", progress_bar=False)
    video = original(PROMPT, **kwargs)
    assert video.std() > 0
    torch.testing.assert_close(video, twin(PROMPT, **kwargs), rtol=1e-4, atol=1e-4)


def test_ti2v_text_to_video_matches_diffusers(ti2v):
    from diffusers import WanPipeline

    theirs = WanPipeline(tokenizer=ti2v.tokenizer, text_encoder=ti2v.text_encoder, transformer=ti2v.dit,
                         vae=ti2v.vae, scheduler=unipc(), expand_timesteps=True)
    theirs.set_progress_bar_config(disable=True)
    video = ours_with_unipc(ti2v, seed=3, **SIZE)
    reference = theirs(PROMPT, negative_prompt=NEGATIVE, guidance_scale=SIZE["cfg_scale"], output_type="pt",
                       generator=torch.Generator().manual_seed(3),
                       **{k: v for k, v in SIZE.items() if k != "cfg_scale"}).frames
    assert video.shape == reference.shape == (1, 5, 3, 64, 96)
    assert (video - reference).abs().max() < 1e-4


def test_ti2v_image_to_video_matches_diffusers_and_keeps_the_first_frame(ti2v):
    from diffusers import WanImageToVideoPipeline

    theirs = WanImageToVideoPipeline(tokenizer=ti2v.tokenizer, text_encoder=ti2v.text_encoder, transformer=ti2v.dit,
                                     vae=ti2v.vae, scheduler=unipc(), expand_timesteps=True)
    theirs.set_progress_bar_config(disable=True)
    video = ours_with_unipc(ti2v, seed=3, input_image=picture(0), **SIZE)
    other = ours_with_unipc(ti2v, seed=3, input_image=picture(1), **SIZE)
    reference = theirs(image=picture(0), prompt=PROMPT, negative_prompt=NEGATIVE, guidance_scale=SIZE["cfg_scale"],
                       generator=torch.Generator().manual_seed(3), output_type="pt",
                       **{k: v for k, v in SIZE.items() if k != "cfg_scale"}).frames
    assert video.shape == reference.shape == (1, 5, 3, 64, 96)
    assert (video - reference).abs().max() < 1e-4
    assert (other - reference).abs().max() > 1e-2  # the image steers the video


def test_ti2v_rounds_sizes_to_its_multiple_of_32(ti2v, caplog):
    assert ti2v.size_multiple() == 32 and ti2v.latent_channels == 48 and ti2v.spatial_compression() == 16
    with caplog.at_level(logging.WARNING, logger="diffsynth.pipelines"):
        frames = ti2v(PROMPT, cfg_scale=1.0, height=48, width=48, num_frames=5, num_inference_steps=1, seed=0,
                      progress_bar=False)
    assert all(frame.size == (64, 64) for frame in frames)
    assert "height=48 is not a multiple of 32; using 64" in caplog.text


def test_ti2v_units_and_training_loss_leave_the_given_first_frame_out(ti2v):
    from tests.pipelines.declarations import check_declarations

    ti2v.scheduler.set_timesteps(2)
    frames = [picture(i, (64, 64)) for i in range(5)]
    shared, posi, nega = ti2v.training_inputs({"video": frames, "prompt": PROMPT}, extra_inputs=("input_image",))
    assert shared["input_image"] is frames[0]  # no input_image column: the first frame, as the reference takes it
    assert check_declarations(ti2v, dict(shared, cfg_scale=2.0), dict(posi), {"negative_prompt": NEGATIVE}) == {}
    state = ti2v.run_units(shared, posi, nega)
    first = state[0]["first_frame_latents"]
    assert first.shape == (1, 48, 1, 4, 4) and state[0]["y"] is None
    # the first latent frame is encoded from the first frame alone, like the video's own first latent frame
    torch.testing.assert_close(first, state[0]["input_latents"][:, :, :1], rtol=1e-4, atol=1e-4)

    loss = FlowMatchSFTLoss()(ti2v, *state, generator=torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(0)
    timestep = ti2v.scheduler.sample_training_timestep(generator, 0.0, 1.0)
    noise = torch.randn(state[0]["input_latents"].shape, generator=generator)
    noisy = ti2v.scheduler.add_noise(state[0]["input_latents"], noise, timestep)
    prediction = ti2v.model_fn(**{**state[0], **state[1], "latents": noisy, "timestep": timestep})
    target = ti2v.scheduler.training_target(state[0]["input_latents"], noise, timestep)
    expected = torch.nn.functional.mse_loss(prediction[:, :, 1:], target[:, :, 1:])
    torch.testing.assert_close(loss, expected * ti2v.scheduler.training_weight(timestep).reshape(()))
    whole = torch.nn.functional.mse_loss(prediction, target) * ti2v.scheduler.training_weight(timestep).reshape(())
    assert not torch.isclose(loss, whole)


@pytest.mark.parametrize(("model_id", "boundary", "image"), [(WAN22_T2V_MODEL_ID, 0.875, False),
                                                             (WAN22_I2V_MODEL_ID, 0.9, True)])
def test_a14b_switches_experts_at_the_boundary_like_diffusers(base, without_ftfy, model_id, boundary, image):
    from diffusers import WanImageToVideoPipeline, WanPipeline

    pipe = load(model_id, WAN22_A14B_PATTERNS, "dit", "dit2", "text_encoder", "vae")
    assert pipe.dit2 is not None and pipe.model_configs["dit2"].origin_file_pattern.startswith("low_noise_model/")
    parts = dict(tokenizer=pipe.tokenizer, text_encoder=pipe.text_encoder, transformer=pipe.dit,
                 transformer_2=pipe.dit2, vae=pipe.vae, scheduler=unipc(), boundary_ratio=boundary)
    theirs = WanImageToVideoPipeline(**parts) if image else WanPipeline(**parts)
    theirs.set_progress_bar_config(disable=True)
    size = dict(height=32, width=48, num_frames=5, num_inference_steps=4)
    extra = {"image": picture(0)} if image else {}
    reference = theirs(prompt=PROMPT, negative_prompt=NEGATIVE, guidance_scale=4.0, output_type="pt",
                       generator=torch.Generator().manual_seed(5), **extra, **size).frames
    ours_extra = {"input_image": picture(0)} if image else {}
    video = ours_with_unipc(pipe, seed=5, cfg_scale=4.0, **ours_extra, **size)
    assert (video - reference).abs().max() < 1e-4
    # both experts take part: moving the boundary past every step leaves the high-noise expert alone
    high_only = ours_with_unipc(pipe, seed=5, cfg_scale=4.0, boundary_ratio=0.001, **ours_extra, **size)
    assert (high_only - reference).abs().max() > 1e-2


def test_the_a14b_experts_load_from_the_diffusers_layout_too(base, tmp_path, monkeypatch):
    original = load(WAN22_T2V_MODEL_ID, WAN22_A14B_PATTERNS, "dit", "dit2")
    repo = tmp_path / "Wan-AI" / "Wan2.2-T2V-A14B-Diffusers"  # diffusers' layout: transformer/ and transformer_2/
    original.dit.save_pretrained(repo / "transformer", max_shard_size="100KB")
    original.dit2.save_pretrained(repo / "transformer_2", max_shard_size="100KB")
    monkeypatch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tmp_path))
    patterns = {"dit": "transformer/diffusion_pytorch_model*.safetensors",
                "dit2": "transformer_2/diffusion_pytorch_model*.safetensors"}
    layout = load("Wan-AI/Wan2.2-T2V-A14B-Diffusers", patterns, "dit", "dit2")
    for name in ("dit", "dit2"):
        ours, theirs = getattr(layout, name).state_dict(), getattr(original, name).state_dict()
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert not torch.equal(layout.dit.proj_out.weight, layout.dit2.proj_out.weight)


def test_slots_of_names_the_slots_loading_fills_without_loading(base):
    from diffsynth.core.loader import model_class_name

    names = ("text_encoder", "dit", "vae", "dit2")
    configs = [ModelConfig(model_id=WAN22_T2V_MODEL_ID, origin_file_pattern=WAN22_A14B_PATTERNS[name]) for name in names]
    pipe = WanVideoPipeline.from_pretrained(torch.float32, "cpu", configs)
    loaded = {id(config): slot for slot, config in pipe.model_configs.items()}
    predicted = WanVideoPipeline.slots_of([model_class_name(config) for config in configs])
    assert predicted == [loaded[id(config)] for config in configs] == list(names)
