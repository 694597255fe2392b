"""Wan Fun Control and Control-Camera: the PAI releases load, the conditioning equals independent computations from
the reference's definitions (DiffSynth-Studio's ``WanVideoUnit_FunControl`` / ``_FunReference`` /
``_FunCameraControl`` and its camera controller), and each control input steers the video."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from diffsynth.core.loader import ModelConfig, load_model
from diffsynth.pipelines.common import video_to_tensor
from diffsynth.pipelines.wan_video.camera import CAMERA_ORIGIN, camera_latents, camera_poses, plucker_embedding
from diffsynth.pipelines.wan_video.fun_control import FunCameraUnit, FunControlUnit, fun_kind
from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
from diffsynth.testing.tiny_wan_fun import FUN_RELEASES, build_tiny_wan_fun_repos, tiny_fun_transformer
from tests.pipelines.family_helpers import assert_same_model

V10, V11, CAMERA = "PAI/Wan2.1-Fun-1.3B-Control", "PAI/Wan2.1-Fun-V1.1-1.3B-Control", \
    "PAI/Wan2.1-Fun-V1.1-1.3B-Control-Camera"
WAN22, WAN22_CAMERA = "PAI/Wan2.2-Fun-A14B-Control", "PAI/Wan2.2-Fun-A14B-Control-Camera"
CLIP = "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth"
CALL = dict(prompt="a red cat", height=32, width=48, num_frames=5, num_inference_steps=1, cfg_scale=1.0, seed=0,
            output_type="pt", progress_bar=False)
# Two runs of one pipeline on the same inputs agree to the last bit; another control input moves the frames by more
# than 1e-3 (at least 0.01 seen with these tiny weights), so the checks below have teeth.
MOVES = 1e-3


def frames(seed: int, count: int = 5) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (32, 48, 3), dtype=np.uint8)) for _ in range(count)]


def files(model_id: str) -> list[str]:
    release = FUN_RELEASES[model_id]
    dits = ["high_noise_model/diffusion_pytorch_model*.safetensors",
            "low_noise_model/diffusion_pytorch_model*.safetensors"] if release.experts else \
        ["diffusion_pytorch_model*.safetensors"]
    return [*dits, "models_t5_umt5-xxl-enc-bf16.pth", "Wan2.1_VAE.pth", *([CLIP] if release.clip else [])]


@pytest.fixture(scope="module")
def fun_root(tmp_path_factory):
    return build_tiny_wan_fun_repos(tmp_path_factory.mktemp("fun_models"))


@pytest.fixture(scope="module")
def pipes(fun_root):
    loaded = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(fun_root))
        for model_id in (V10, V11, CAMERA, WAN22, WAN22_CAMERA):
            loaded[model_id] = WanVideoPipeline.from_pretrained(torch.float32, "cpu", [
                ModelConfig(model_id=model_id, origin_file_pattern=name) for name in files(model_id)])
    return loaded


# ---- the released layouts ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_id", list(FUN_RELEASES))
def test_each_release_loads_into_its_transformer_with_every_tensor(pipes, model_id):
    pipe, release = pipes[model_id], FUN_RELEASES[model_id]
    assert_same_model(pipe.dit, tiny_fun_transformer(release, 0).eval())
    assert (pipe.dit2 is not None) == release.experts and (pipe.image_encoder is not None) == release.clip
    assert fun_kind(pipe.dit) == ("camera" if release.camera else "control")
    assert (getattr(pipe.dit, "ref_conv", None) is not None) == release.reference_conv


# ---- the conditioning, against the reference's definitions --------------------------------------------------------


def reference_plucker(direction: str, count: int, height: int, width: int, speed: float) -> np.ndarray:
    """The reference's camera embedding written out per frame and per pixel in numpy: poses moved per direction
    word, cameras made relative to the first, intrinsics fitted to 1280x720 footage, then ``(o x d, d)`` per ray."""
    moves = {"Left": (9, speed), "Right": (9, -speed), "Up": (13, speed), "Down": (13, -speed)}
    pose, poses = list(CAMERA_ORIGIN), []
    for _ in range(count):
        poses.append(list(pose))
        for word, (index, step) in moves.items():
            pose[index] += step if word in direction else 0
    w2c = [np.vstack([np.array(p[7:], dtype=np.float64).reshape(3, 4), [0, 0, 0, 1]]) for p in poses]
    out = np.zeros((count, height, width, 6))
    for f, p in enumerate(poses):
        fx, fy, cx, cy = p[1:5]
        if 1280 / 720 > width / height:
            fx = height * (1280 / 720) * fx / width
        else:
            fy = width / (1280 / 720) * fy / height
        c2w = np.eye(4) if f == 0 else w2c[0] @ np.linalg.inv(w2c[f])
        for row in range(height):
            for column in range(width):
                d = np.array([(column + 0.5 - cx * width) / (fx * width), (row + 0.5 - cy * height) / (fy * height), 1])
                d = c2w[:3, :3] @ (d / np.linalg.norm(d))
                out[f, row, column] = np.concatenate([np.cross(c2w[:3, 3], d), d])
    return out


@pytest.mark.parametrize(("direction", "speed"), [("Left", 1 / 54), ("RightUp", 0.3), ("Down", 0.1)])
def test_the_plucker_embedding_equals_the_reference_definition(direction, speed):
    ours = plucker_embedding(camera_poses(direction, 5, speed), 16, 32)
    expected = torch.from_numpy(reference_plucker(direction, 5, 16, 32, speed)).float()
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-5)
    assert (ours[1:] - ours[0]).abs().max() > 0.01  # the camera moves


def test_camera_latents_fold_four_frames_per_latent_frame():
    plucker = torch.randn(9, 4, 6, 6)
    folded = camera_latents(plucker)
    assert folded.shape == (1, 24, 3, 4, 6)
    padded = torch.cat([plucker[:1]] * 4 + [plucker[1:]])  # the first frame four times, as the VAE folds it
    for latent in range(3):
        for coordinate in range(6):
            for k in range(4):
                assert torch.equal(folded[0, 4 * coordinate + k, latent], padded[4 * latent + k, :, :, coordinate])


def test_the_camera_adapter_equals_its_definition(pipes):
    adapter = pipes[CAMERA].dit.control_adapter
    camera = torch.randn(1, 24, 2, 32, 48)
    per_frame = F.pixel_unshuffle(camera[0].transpose(0, 1), 8)  # (frames, 24 * 64, 4, 6)
    hidden = F.conv2d(per_frame, adapter.conv.weight, adapter.conv.bias, stride=2)
    block = adapter.residual_blocks[0]
    hidden = hidden + F.conv2d(F.relu(F.conv2d(hidden, block.conv1.weight, block.conv1.bias, padding=1)),
                               block.conv2.weight, block.conv2.bias, padding=1)
    torch.testing.assert_close(adapter(camera), hidden.transpose(0, 1).unsqueeze(0), rtol=1e-5, atol=1e-6)


def test_reference_tokens_are_a_frame_before_the_video(pipes):
    """With ``ref_conv`` made the patch embedding of the latent channels, the reference tokens equal the patch
    embedding of a first frame holding the reference latents: the Fun forward then equals diffusers' own forward on
    the longer video, that frame dropped (the reference puts its tokens first and gives them RoPE frame 0)."""
    dit = copy.deepcopy(pipes[V11].dit)
    plain = load_plain_twin(dit)
    with torch.no_grad():
        dit.ref_conv.weight.copy_(dit.patch_embedding.weight[:, :16, 0])
        dit.ref_conv.bias.copy_(dit.patch_embedding.bias)
    reference = torch.randn(1, 16, 4, 6)
    hidden = torch.randn(1, 48, 2, 4, 6)
    first = torch.cat([reference, torch.zeros(1, 32, 4, 6)], dim=1).unsqueeze(2)
    inputs = dict(timestep=torch.tensor([700.0]), encoder_hidden_states=torch.randn(1, 5, 32),
                  encoder_hidden_states_image=torch.randn(1, 3, 32), return_dict=False)
    with torch.no_grad():
        ours = dit(hidden_states=hidden, reference_latents=reference, **inputs)[0]
        expected = plain(hidden_states=torch.cat([first, hidden], dim=2), **inputs)[0][:, :, 1:]
        without = dit(hidden_states=hidden, **inputs)[0]
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
    assert (ours - without).abs().max() > 100 * 1e-5


def load_plain_twin(dit):
    from diffusers import WanTransformer3DModel

    config = {key: value for key, value in dit.config.items()
              if key not in ("reference_conv", "camera_channels") and not key.startswith("_")}
    plain = WanTransformer3DModel.from_config(config).eval()
    plain.load_state_dict(dit.state_dict(), strict=False)
    return plain


def normalised_latents(pipe, video):
    latents = pipe.vae.encode(video).latent_dist.mode()
    mean = torch.tensor(pipe.vae.config.latents_mean).view(1, -1, 1, 1, 1)
    return (latents - mean) / torch.tensor(pipe.vae.config.latents_std).view(1, -1, 1, 1, 1)


@pytest.mark.parametrize(("model_id", "image_channels"), [(V10, 16), (WAN22, 20)])
def test_control_y_is_the_control_latents_then_the_image_condition(pipes, model_id, image_channels):
    pipe, control = pipes[model_id], frames(1)
    with torch.no_grad():
        expected = normalised_latents(pipe, video_to_tensor(control))
        out = FunControlUnit().process(pipe, control, 32, 48, 5, y=None, clip_feature=None)
        image_y = torch.randn(1, 20, 2, 4, 6)
        given = FunControlUnit().process(pipe, control, 32, 48, 5, y=image_y, clip_feature=None)
    torch.testing.assert_close(out["y"][:, :16], expected, rtol=1e-5, atol=1e-5)
    assert out["y"].shape[1] == 16 + image_channels and not out["y"][:, 16:].any()
    assert torch.equal(given["y"][:, 16:], image_y[:, -image_channels:])
    if pipe.dit.config.image_dim:  # no image: the CLIP features are 257 zero tokens, as the reference gives them
        assert out["clip_feature"].shape == (1, 257, 32) and not out["clip_feature"].any()
    else:
        assert out["clip_feature"] is None


def test_wan21_camera_y_is_the_first_frame_alone_on_latent_frame_zero(pipes):
    pipe, image = pipes[CAMERA], frames(4, 1)[0]
    with torch.no_grad():
        out = FunCameraUnit().process(pipe, "Left", 1 / 54, None, image, 32, 48, 5, y=torch.zeros(1, 20, 2, 4, 6))
        expected = normalised_latents(pipe, video_to_tensor([image]))
    assert out["y"].shape == (1, 16, 2, 4, 6) and not out["y"][:, :, 1:].any()
    torch.testing.assert_close(out["y"][:, :, :1], expected, rtol=1e-5, atol=1e-5)
    poses = camera_poses("Left", 5, 1 / 54)
    assert torch.equal(out["camera_latents"], camera_latents(plucker_embedding(poses, 32, 48)))
    given = torch.ones(1, 20, 2, 4, 6)
    kept = FunCameraUnit().process(pipes[WAN22_CAMERA], "Left", 1 / 54, None, image, 32, 48, 5, y=given)
    assert kept["y"] is given  # Wan2.2: the image-to-video mask and latents, as ImageConditionUnit made them


# ---- each input steers the video -----------------------------------------------------------------------------------


def assert_each_moves(pipe, inputs, *changes):
    """The same inputs give the same frames; each change of one input moves them by more than ``MOVES``."""
    first = pipe(**CALL, **inputs)
    assert torch.equal(pipe(**CALL, **inputs), first)
    for change in changes:
        assert (pipe(**CALL, **{**inputs, **change}) - first).abs().max() > MOVES, change


@pytest.mark.parametrize("model_id", [V10, V11, WAN22])
def test_the_control_video_and_reference_image_steer_the_video(pipes, model_id):
    inputs, changes = {"control_video": frames(1)}, [{"control_video": frames(2)}]
    if FUN_RELEASES[model_id].reference_conv:
        inputs["reference_image"] = frames(7, 1)[0]
        changes.append({"reference_image": frames(8, 1)[0]})
    assert_each_moves(pipes[model_id], inputs, *changes)


@pytest.mark.parametrize("model_id", [CAMERA, WAN22_CAMERA])
def test_the_camera_motion_steers_the_video(pipes, model_id):
    assert_each_moves(pipes[model_id], {"input_image": frames(5, 1)[0], "camera_control_direction": "Left"},
                      {"camera_control_direction": "Up", "camera_control_speed": 0.2})


def test_inputs_the_model_cannot_use_are_refused_by_name(pipes):
    with pytest.raises(ValueError, match="needs control_video"):
        pipes[V10](**CALL)
    with pytest.raises(ValueError, match="control_video was given"):
        pipes[CAMERA](**CALL, input_image=frames(1, 1)[0], control_video=frames(1))
    with pytest.raises(ValueError, match="reference_image was given"):
        pipes[V10](**CALL, control_video=frames(1), reference_image=frames(1, 1)[0])
    with pytest.raises(ValueError, match="camera_control_direction='Sideways'"):
        pipes[CAMERA](**CALL, input_image=frames(1, 1)[0], camera_control_direction="Sideways")
    with pytest.raises(ValueError, match="camera_control_direction was given"):
        pipes[V10](**CALL, control_video=frames(1), camera_control_direction="Left")
    with pytest.raises(ValueError, match="fewer than num_frames=5"):
        pipes[V10](**CALL, control_video=frames(1, 3))
    assert pipes[V10].sample_input_problems({"control_video"}) == []
    assert pipes[CAMERA].sample_input_problems({"camera_control_direction"})  # needs input_image


def test_load_model_builds_the_fun_class_from_the_released_folder(fun_root, monkeypatch):
    monkeypatch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(fun_root))
    dit = load_model(ModelConfig(model_id=WAN22_CAMERA, origin_file_pattern=files(WAN22_CAMERA)[1]), torch.float32)
    assert type(dit).__name__ == "WanFunTransformer3DModel" and dit.config.camera_channels == 24


def test_samples_get_the_inputs_their_model_reads(pipes):
    assert pipes[V10].sample_input_problems(set()) and not pipes[V10].sample_input_problems({"control_video"})
    assert pipes[V10].sample_input_problems({"control_video", "reference_image"})
    assert not pipes[V11].sample_input_problems({"control_video", "reference_image"})
    assert pipes[CAMERA].sample_input_problems({"input_image", "control_video"})
    assert not pipes[CAMERA].sample_input_problems({"input_image", "camera_control_direction"})
    assert pipes[WAN22].sample_input_problems({"control_video", "camera_control_direction"})


def test_a_stage_without_the_transformer_says_the_fun_inputs_need_it(pipes):
    pipe = pipes[V11]
    dit, pipe.dit = pipe.dit, None
    try:
        with pytest.raises(ValueError, match="needs the transformer loaded"):
            FunControlUnit().process(pipe, frames(1), 32, 48, 5, y=None, clip_feature=None)
    finally:
        pipe.dit = dit


def test_a_saved_diffusers_folder_of_the_fun_transformer_loads_back(pipes, tmp_path):
    dit = pipes[WAN22_CAMERA].dit
    dit.save_pretrained(tmp_path / "transformer")
    loaded = load_model(ModelConfig(path=sorted(str(p) for p in (tmp_path / "transformer").glob("*.safetensors"))),
                        torch.float32)
    assert_same_model(loaded, dit)
