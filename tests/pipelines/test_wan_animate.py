"""Wan2.2-Animate: the release's original layout read into diffusers' WanAnimateTransformer3DModel, parity with
diffusers' WanAnimatePipeline on the tiny repos in animation and replacement mode (with teeth), and bad input."""

import types

import numpy as np
import pytest
import torch
from PIL import Image

from diffsynth.diffusion.flow_match import DiffusersScheduler
from diffsynth.pipelines.wan_video.pipeline import ModelConfig, WanVideoPipeline
from diffsynth.testing.tiny_models import WAN_SCHEDULER_CONFIG
from diffsynth.testing.tiny_wan import WAN_I2V_ORIGINAL_PATTERNS
from diffsynth.testing.tiny_wan_animate import WAN_ANIMATE_DIFFUSERS_MODEL_ID, WAN_ANIMATE_MODEL_ID
from tests.pipelines.family_helpers import load_theirs

PROMPT = "a dancer"
HEIGHT, WIDTH, FRAMES = 32, 48, 5  # the video's frames; num_frames counts the character's latent slot too
PATTERNS = [WAN_I2V_ORIGINAL_PATTERNS[slot] for slot in ("dit", "text_encoder", "vae", "image_encoder")]


def frames(seed: int, count: int = FRAMES, size=(WIDTH, HEIGHT)) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)) for _ in range(count)]


def masks(left: bool) -> list[Image.Image]:
    array = np.zeros((HEIGHT, WIDTH, 3), dtype=np.uint8)
    array[:, :WIDTH // 2 if left else WIDTH] = 255
    return [Image.fromarray(array)] * FRAMES


@pytest.fixture(scope="module")
def pipes(tiny_root):
    from diffusers import UniPCMultistepScheduler, WanAnimatePipeline
    from diffusers.pipelines.wan import pipeline_wan_animate

    if not hasattr(pipeline_wan_animate, "ftfy"):  # its prompt cleaning calls ftfy unguarded; not installed here
        pipeline_wan_animate.ftfy = types.SimpleNamespace(fix_text=lambda text: text)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        ours = WanVideoPipeline.from_pretrained(torch.float32, "cpu", [
            ModelConfig(model_id=WAN_ANIMATE_MODEL_ID, origin_file_pattern=pattern) for pattern in PATTERNS])
    ours.scheduler = DiffusersScheduler(UniPCMultistepScheduler.from_config(WAN_SCHEDULER_CONFIG))
    return ours, load_theirs(tiny_root, WanAnimatePipeline, WAN_ANIMATE_DIFFUSERS_MODEL_ID)


def inputs(character=1, pose=2, face=3, background=None, left=True):
    given = dict(input_image=frames(character, 1)[0], animate_pose_video=frames(pose),
                 animate_face_video=frames(face, size=(16, 16)))
    if background is not None:
        given.update(animate_inpaint_video=frames(background), animate_mask_video=masks(left))
    return given


def render(pipe, cfg_scale=1.0, steps=2, **given):
    return pipe(PROMPT, negative_prompt="blurry", cfg_scale=cfg_scale, seed=7, height=HEIGHT, width=WIDTH,
                num_frames=FRAMES + 4, num_inference_steps=steps, output_type="pt", progress_bar=False,
                max_sequence_length=16, **given)


def reference(pipe, cfg_scale=1.0, **given):
    mode = "replace" if "animate_inpaint_video" in given else "animate"
    return pipe(image=given["input_image"], pose_video=given["animate_pose_video"],
                face_video=given["animate_face_video"], background_video=given.get("animate_inpaint_video"),
                mask_video=given.get("animate_mask_video"), prompt=PROMPT, negative_prompt="blurry",
                height=HEIGHT, width=WIDTH, segment_frame_length=FRAMES, num_inference_steps=2, mode=mode,
                guidance_scale=cfg_scale, generator=torch.Generator().manual_seed(7), output_type="pt",
                max_sequence_length=16).frames


def test_the_original_release_reads_into_diffusers_weights(pipes):
    ours, theirs = pipes
    assert type(ours.dit).__name__ == "WanAnimateTransformer3DModel"
    expected = theirs.transformer.state_dict()
    loaded = ours.dit.state_dict()
    assert set(loaded) == set(expected) and all(torch.equal(loaded[key], expected[key]) for key in expected)
    assert {key: value for key, value in ours.dit.config.items() if not key.startswith("_")} == \
        {key: value for key, value in theirs.transformer.config.items() if not key.startswith("_")}


@pytest.mark.parametrize("mode", ["animate", "replace", "animate_cfg", "tall_character"])
def test_matches_diffusers_animate_pipeline(pipes, mode):
    """Both modes, with CFG (the blank face in the negative branch), and a character of another shape (fitted on
    black)."""
    ours, theirs = pipes
    given = inputs(background=4 if mode == "replace" else None)
    if mode == "tall_character":
        given["input_image"] = frames(9, 1, size=(20, 40))[0]
    cfg = 2.0 if mode == "animate_cfg" else 1.0
    video, expected = render(ours, cfg, **given), reference(theirs, cfg, **given)
    assert video.shape == expected.shape == (1, FRAMES, 3, HEIGHT, WIDTH)
    assert (video - expected).abs().max() < 1e-4


def test_each_input_moves_the_output(pipes):
    """Another character, pose, face, background or mask changes the video by at least 20 times the tolerance (one
    denoising step carries each input into the output)."""
    ours, _ = pipes
    base = render(ours, steps=1, **inputs(background=4))
    for other in (dict(character=5), dict(pose=6), dict(face=7), dict(background=8), dict(left=False)):
        moved = (render(ours, steps=1, **inputs(**{"background": 4, **other})) - base).abs().max()
        assert moved > 2e-3, (other, moved)  # measured 0.022 (background) to 0.24 (mask)
    assert (render(ours, steps=1, **inputs()) - base).abs().max() > 2e-3  # animation mode differs from replacement


def test_bad_animate_input_is_refused_before_denoising(pipes, tiny_root):
    ours, _ = pipes
    given = inputs()
    with pytest.raises(ValueError, match="needs input_image .* animate_face_video is missing"):
        render(ours, **{**given, "animate_face_video": None})
    with pytest.raises(ValueError, match="animate_inpaint_video .* and animate_mask_video .* together"):
        render(ours, **given, animate_inpaint_video=frames(4))
    with pytest.raises(ValueError, match="animate_pose_video has 3 frames, fewer than num_frames=5"):
        render(ours, **{**given, "animate_pose_video": frames(2, 3)})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        plain = WanVideoPipeline.from_pretrained(torch.float32, "cpu", [
            ModelConfig(model_id="Wan-AI/Wan2.1-T2V-1.3B", origin_file_pattern=pattern)
            for pattern in ("diffusion_pytorch_model*.safetensors", "Wan2.1_VAE.pth")])
    with pytest.raises(ValueError, match="animate_pose_video given, but the transformer .* is not a Wan2.2-Animate"):
        plain.units[5].process(plain, frames(2), None, None, None, None, HEIGHT, WIDTH, 9, None)
    assert plain.sample_input_problems({"animate_pose_video"}) == [
        "animate_pose_video given, but " + plain.describe_transformer() + " is not Wan2.2-Animate"]


def test_animate_adapter_names_the_animate_modules_of_the_transformer():
    from diffsynth.testing.tiny_wan_animate import tiny_wan_animate_transformer

    dit = tiny_wan_animate_transformer(0)
    assert WanVideoPipeline.host_model("animate_adapter") == "dit"
    parts = ("pose_patch_embedding", "motion_encoder", "face_encoder", "face_adapter")
    assert WanVideoPipeline.part_scope("animate_adapter", dit) == (parts, ())


def test_units_do_what_they_declare(pipes):
    from tests.pipelines.declarations import check_declarations

    ours, _ = pipes
    ours.scheduler.set_timesteps(2)
    shared = {"cfg_scale": 2.0, "height": HEIGHT, "width": WIDTH, "num_frames": FRAMES + 4, "seed": 0,
              "rand_device": "cpu", "input_video": frames(0, FRAMES + 4), "max_sequence_length": 16,
              **inputs(background=4)}
    assert check_declarations(ours, shared, {"prompt": PROMPT}, {"negative_prompt": ""}) == {}


def test_the_planner_gives_the_animate_transformer_its_pose_and_face_inputs():
    from diffsynth.pipelines.wan_video.planning import planner_inputs
    from diffsynth.testing.tiny_wan_animate import tiny_wan_animate_transformer

    dit = tiny_wan_animate_transformer(0).to("meta")
    inputs = planner_inputs(dit, HEIGHT, WIDTH, FRAMES + 4, torch.float32, 1, 16)
    assert inputs["pose_hidden_states"].shape == (1, 16, 2, 4, 6)
    assert inputs["face_pixel_values"].shape == (1, 3, FRAMES, 8, 8)
    inputs["encoder_hidden_states_image"] = torch.empty(1, 17, 32, device="meta")  # the tiny CLIP's tokens
    assert dit(**inputs)[0].shape == (1, 16, 3, 4, 6)


def test_fp8_storage_holds_the_animate_modules_in_fp8():
    """``--fp8_models`` on the Animate transformer: its pose embedding, face encoder and face adapter are stored in fp8
    too, and the forward with every Animate input runs within fp8's rounding of the full-precision one."""
    from diffsynth.core.fp8 import holds_fp8_layers, store_model_in_fp8
    from diffsynth.pipelines.wan_video.planning import planner_inputs
    from diffsynth.testing.tiny_wan_animate import tiny_wan_animate_transformer

    dit = tiny_wan_animate_transformer(0).requires_grad_(False)
    generator = torch.Generator().manual_seed(0)
    inputs = {key: torch.randn(value.shape, generator=generator) if isinstance(value, torch.Tensor) else value
              for key, value in planner_inputs(dit.to("meta"), HEIGHT, WIDTH, FRAMES + 4, torch.float32, 1,
                                               16).items()}
    dit = tiny_wan_animate_transformer(0).requires_grad_(False)
    inputs["encoder_hidden_states_image"] = torch.randn(1, 17, 32, generator=generator)  # the tiny CLIP's tokens
    inputs["timestep"] = torch.tensor([500.0])
    with torch.no_grad():
        full = dit(**inputs)[0]
        store_model_in_fp8(dit)
        rounded = dit(**inputs)[0]
    for name in ("pose_patch_embedding", "face_encoder", "face_adapter"):
        assert holds_fp8_layers(dit.get_submodule(name)), name
    # The motion encoder's layers are diffusers' own MotionConv2d / MotionLinear (no Linear or Conv subclasses, their
    # weights read by functional calls): kept in their dtype, a small part of the model.
    assert not holds_fp8_layers(dit.motion_encoder)
    error = ((rounded - full).norm() / full.norm()).item()
    assert 1e-4 < error < 0.06, error  # fp8's rounding: in effect, and no more
