"""Wan image-to-video: parity with diffusers' WanImageToVideoPipeline on the tiny I2V repo, unit declarations, the
image processor's loading, training inputs and the errors for an image the model cannot use."""

import contextlib
import json
import types

import numpy as np
import pytest
import torch
from PIL import Image

from diffsynth.core.loader import ModelConfig, load_model
from diffsynth.testing.tiny_models import (WAN_I2V_MODEL_ID, WAN_I2V_PATTERNS, WAN_MODEL_ID, WAN_PATTERNS,
                                               WAN_SCHEDULER_CONFIG)
from diffsynth.diffusion.flow_match import DiffusersScheduler
from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline

PROMPT, NEGATIVE = "a red ball rolling", "static, blurry"
SIZE = dict(height=32, width=48, num_frames=5, num_inference_steps=3)


def picture(seed, size=(40, 24)):
    """A noise image of another size than the video, so the resize to height x width is exercised."""
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def configs(model_id, patterns, *names):
    return [ModelConfig(model_id=model_id, origin_file_pattern=patterns[n]) for n in names]


@contextlib.contextmanager
def reference_schedule(ours, theirs):
    """Samples with a fresh copy of the reference pipeline's own UniPC scheduler, then puts ours back."""
    own = ours.scheduler
    ours.scheduler = DiffusersScheduler(type(theirs.scheduler).from_config(theirs.scheduler.config))
    try:
        yield
    finally:
        ours.scheduler = own


@pytest.fixture(scope="module")
def pipes(tiny_root):
    import diffusers.pipelines.wan.pipeline_wan_i2v as reference_module
    from diffusers import WanImageToVideoPipeline

    models = configs(WAN_I2V_MODEL_ID, WAN_I2V_PATTERNS, "dit", "text_encoder", "vae", "image_encoder")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        ours = WanVideoPipeline.from_pretrained(torch.float32, "cpu", models)
    theirs = WanImageToVideoPipeline.from_pretrained(str(tiny_root / WAN_I2V_MODEL_ID), dtype=torch.float32)
    theirs.set_progress_bar_config(disable=True)
    assert theirs.scheduler.config.flow_shift == WAN_SCHEDULER_CONFIG["flow_shift"]
    with pytest.MonkeyPatch.context() as patch:
        # diffusers' I2V prompt cleaning calls ftfy unguarded; ours skips it when ftfy is missing, so stand in with
        # the identity it amounts to.
        if not hasattr(reference_module, "ftfy"):
            patch.setattr(reference_module, "ftfy", types.SimpleNamespace(fix_text=lambda text: text), raising=False)
        yield ours, theirs


@pytest.mark.parametrize("cfg_scale", [1.0, 4.0])
def test_matches_diffusers_image_to_video_pipeline(pipes, cfg_scale):
    ours, theirs = pipes
    with reference_schedule(ours, theirs):
        video = ours(PROMPT, negative_prompt=NEGATIVE, cfg_scale=cfg_scale, input_image=picture(0), seed=7,
                     output_type="pt", progress_bar=False, **SIZE)
        other_image = ours(PROMPT, negative_prompt=NEGATIVE, cfg_scale=cfg_scale, input_image=picture(1), seed=7,
                           output_type="pt", progress_bar=False, **SIZE)
    reference = theirs(image=picture(0), prompt=PROMPT, negative_prompt=NEGATIVE, guidance_scale=cfg_scale,
                       generator=torch.Generator().manual_seed(7), output_type="pt", **SIZE).frames
    assert video.shape == reference.shape == (1, 5, 3, 32, 48)
    assert (video - reference).abs().max() < 1e-4
    assert (other_image - reference).abs().max() > 1e-2  # the image really steers the video


def test_image_inputs_reach_the_transformer(pipes):
    ours, _ = pipes
    shared, posi, _ = ours.run_units({**SIZE, "seed": 0, "input_image": picture(0)}, {"prompt": PROMPT}, {})
    y, clip_feature = shared["y"], shared["clip_feature"]
    assert y.shape == (1, 20, 2, 4, 6) and clip_feature.shape == (1, 17, 32)  # 4x4 patches + the class token
    assert torch.equal(y[:, :4, 0], torch.ones_like(y[:, :4, 0])) and not y[:, :4, 1:].any()
    inputs = dict(latents=shared["latents"], timestep=torch.tensor(500.0), prompt_emb=posi["prompt_emb"])
    with_image = ours.model_fn(**inputs, y=y, clip_feature=clip_feature)
    assert (with_image - ours.model_fn(**inputs, y=y, clip_feature=torch.zeros_like(clip_feature))).abs().max() > 0
    with pytest.raises(ValueError, match="in_channels=36, but got 16.*needs input_image"):
        ours.model_fn(**inputs)


def test_units_do_what_they_declare(pipes):
    from tests.pipelines.declarations import check_declarations

    ours, _ = pipes
    ours.scheduler.set_timesteps(2, 0.5)
    shared = {"cfg_scale": 2.0, "height": 32, "width": 48, "num_frames": 5, "seed": 0, "rand_device": "cpu",
              "input_video": [Image.new("RGB", (48, 32))] * 5, "denoising_strength": 0.5, "max_sequence_length": 16,
              "input_image": picture(0)}
    assert check_declarations(ours, shared, {"prompt": PROMPT}, {"negative_prompt": NEGATIVE}) == {}


def test_the_image_to_video_model_without_an_image_is_refused(pipes):
    ours, _ = pipes
    with pytest.raises(ValueError, match=r"in_channels=36, out_channels=16, image_dim=32\) is an image-to-video model "
                                         r"and needs the first frame: pass input_image="):
        ours(PROMPT, cfg_scale=1.0, seed=0, progress_bar=False, **SIZE)
    with pytest.raises(TypeError, match="input_image must be one PIL image"):
        ours(PROMPT, cfg_scale=1.0, input_image="frame.png", seed=0, progress_bar=False, **SIZE)


def test_an_image_for_a_text_to_video_model_is_refused(base):
    pipe = WanVideoPipeline.from_pretrained(torch.float32, "cpu", configs(WAN_MODEL_ID, WAN_PATTERNS, "dit"))
    assert pipe.image_processor is None and pipe.image_conditioning() is None
    with pytest.raises(ValueError, match="input_image was given, but the transformer .* takes no image .*drop "
                                         "input_image"):
        pipe.run_units({**SIZE, "input_image": picture(0)}, {"prompt": PROMPT}, {})
    shared, _, _ = pipe.training_inputs({"video": [Image.new("RGB", (48, 32))] * 5, "prompt": PROMPT})
    assert shared["input_image"] is None  # a video-only dataset trains text-to-video as before


def test_training_inputs_take_the_image_column_or_the_first_frame(pipes):
    ours, _ = pipes
    frames = [picture(i, (48, 32)) for i in range(5)]
    shared, posi, _ = ours.training_inputs({"video": frames, "prompt": PROMPT})
    assert shared["input_image"] is frames[0] and posi == {"prompt": PROMPT}
    shared, _, _ = ours.training_inputs({"video": frames, "prompt": PROMPT, "input_image": picture(9)})
    assert shared["input_image"].tobytes() == picture(9).tobytes()
    with pytest.raises(ValueError, match="add input_image to --data_file_keys"):
        ours.training_inputs({"video": frames, "prompt": PROMPT, "input_image": "first.png"})


def test_split_training_caches_the_image_inputs_for_stage_two(pipes):
    from diffsynth.diffusion.base_pipeline import stage_one_units
    from diffsynth.training.objective.loss import FlowMatchSFTLoss

    ours, _ = pipes
    frames = [picture(i, (48, 32)) for i in range(5)]
    stage_one = stage_one_units(ours.units, ["dit"], extra_keys=FlowMatchSFTLoss.required_keys(ours))
    assert {"ImageConditionUnit", "ImageEmbedderUnit"} <= {type(unit).__name__ for unit in stage_one}
    cache, posi, _ = ours.run_units(*ours.training_inputs({"video": frames, "prompt": PROMPT}), units=stage_one)
    assert {"input_latents", "y", "clip_feature"} <= set(cache) and "input_image" not in cache
    loss = FlowMatchSFTLoss()(ours, cache, posi, {}, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(loss)


def test_the_tiny_repo_and_its_image_encoder_load(base):
    from transformers import CLIPVisionModel

    repo = base / WAN_I2V_MODEL_ID
    index = json.loads((repo / "model_index.json").read_text())
    assert index["_class_name"] == "WanImageToVideoPipeline"
    assert index["image_encoder"] == ["transformers", "CLIPVisionModel"]
    transformer = json.loads((repo / "transformer" / "config.json").read_text())
    encoder = json.loads((repo / "image_encoder" / "config.json").read_text())
    assert transformer["in_channels"] == 36 and transformer["image_dim"] == encoder["hidden_size"]
    ours = load_model(configs(WAN_I2V_MODEL_ID, WAN_I2V_PATTERNS, "image_encoder")[0], torch.float32)
    theirs = CLIPVisionModel.from_pretrained(str(repo / "image_encoder"), dtype=torch.float32)
    assert type(ours) is CLIPVisionModel
    expected = theirs.state_dict()
    assert all(torch.equal(value, expected[name]) for name, value in ours.state_dict().items())


def test_the_image_processor_is_found_beside_a_local_image_encoder(base):
    repo = base / WAN_I2V_MODEL_ID
    local = ModelConfig(path=str(repo / "image_encoder" / "model.safetensors"))
    pipe = WanVideoPipeline.from_pretrained(torch.float32, "cpu", [local])
    assert pipe.image_encoder is not None and pipe.image_processor.crop_size == {"height": 32, "width": 32}
    from diffsynth.core.loader import ModelLoadError

    with pytest.raises(ModelLoadError, match="no preprocessor_config.json"):
        WanVideoPipeline.from_pretrained(torch.float32, "cpu", [local],
                                         image_processor_config=ModelConfig(path=str(repo / "tokenizer")))
