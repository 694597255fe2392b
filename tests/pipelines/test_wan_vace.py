"""Wan VACE: parity with diffusers' WanVACEPipeline on the tiny repo (control video, mask, reference images), the
original release layouts, and bad input."""

import numpy as np
import pytest
import torch
from PIL import Image

from diffsynth.diffusion.flow_match import DiffusersScheduler
from diffsynth.pipelines.wan_video.pipeline import ModelConfig, WanVideoPipeline
from diffsynth.testing.tiny_models import WAN_SCHEDULER_CONFIG
from diffsynth.testing.tiny_wan_vace import (
    WAN22_VACE_FUN_MODEL_ID,
    WAN_VACE_MODEL_ID,
    WAN_VACE_ORIGINAL_MODEL_ID,
    WAN_VACE_PREVIEW_MODEL_ID,
)
from tests.pipelines.family_helpers import load_theirs

PROMPT = "a red cat"
SIZE = dict(height=32, width=48, num_frames=5, num_inference_steps=2)
DIFFUSERS = ("transformer/diffusion_pytorch_model*.safetensors", "text_encoder/model*.safetensors",
             "vae/diffusion_pytorch_model.safetensors")
ORIGINAL = ("diffusion_pytorch_model*.safetensors", "models_t5_umt5-xxl-enc-bf16.pth", "Wan2.1_VAE.pth")


def frames(seed: int, count: int = 5, size=(48, 32)) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)) for _ in range(count)]


def mask_frames(left: bool) -> list[Image.Image]:
    """White (generate) on one half of each frame, black (keep) on the other."""
    array = np.zeros((32, 48, 3), dtype=np.uint8)
    array[:, :24] = 255 if left else 0
    array[:, 24:] = 0 if left else 255
    return [Image.fromarray(array) for _ in range(5)]


def load(root, model_id, patterns):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(root))
        return WanVideoPipeline.from_pretrained(torch.float32, "cpu", [ModelConfig(model_id=model_id,
                                                                                   origin_file_pattern=pattern)
                                                                       for pattern in patterns])


@pytest.fixture(scope="module")
def pipes(tiny_root):
    import types

    from diffusers import UniPCMultistepScheduler, WanVACEPipeline
    from diffusers.pipelines.wan import pipeline_wan_vace

    if not hasattr(pipeline_wan_vace, "ftfy"):
        # Its prompt cleaning calls ftfy unguarded; ftfy is not installed here, and ours skips it likewise.
        pipeline_wan_vace.ftfy = types.SimpleNamespace(fix_text=lambda text: text)

    ours = load(tiny_root, WAN_VACE_MODEL_ID, DIFFUSERS)
    ours.scheduler = DiffusersScheduler(UniPCMultistepScheduler.from_config(WAN_SCHEDULER_CONFIG))
    return ours, load_theirs(tiny_root, WanVACEPipeline, WAN_VACE_MODEL_ID)


def render(pipe, video=None, mask=None, references=None, seed=7, **kwargs):
    return pipe(PROMPT, cfg_scale=1.0, seed=seed, vace_video=video, vace_video_mask=mask,
                vace_reference_image=references, output_type="pt", progress_bar=False, max_sequence_length=16,
                **SIZE, **kwargs)


def reference(pipe, video=None, mask=None, references=None):
    return pipe(PROMPT, video=video, mask=mask, reference_images=references, guidance_scale=1.0,
                generator=torch.Generator().manual_seed(7), output_type="pt", max_sequence_length=16, **SIZE).frames


@pytest.mark.parametrize("case", ["video_mask_reference", "video", "nothing"])
def test_matches_diffusers_vace_pipeline(pipes, case):
    ours, theirs = pipes
    inputs = {"video_mask_reference": dict(video=frames(1), mask=mask_frames(True), references=[frames(2, 1)[0],
                                                                                               frames(3, 1)[0]]),
              "video": dict(video=frames(1)), "nothing": {}}[case]
    video = render(ours, **inputs)
    expected = reference(theirs, **inputs)
    assert video.shape == expected.shape == (1, 5, 3, 32, 48)
    assert (video - expected).abs().max() < 1e-4


def test_each_control_input_moves_the_output(pipes):
    """Each input changes the video by at least 20 times the parity tolerance (the tiny model's hints are weak)."""
    ours, _ = pipes
    base = render(ours, frames(1), mask_frames(True), frames(2, 1)[0])
    for other in (dict(video=frames(4)), dict(mask=mask_frames(False)), dict(references=None)):
        inputs = {"video": frames(1), "mask": mask_frames(True), "references": frames(2, 1)[0], **other}
        assert (render(ours, **inputs) - base).abs().max() > 2e-3, other
    assert (render(ours, frames(1), mask_frames(True), frames(2, 1)[0], vace_scale=0.0) - base).abs().max() > 2e-3


def test_the_control_context_equals_diffusers_and_each_reference_image_shows_in_it(pipes):
    """The context itself (the tiny model's reference frames barely reach the frames kept, so the video cannot show
    which reference image was given): diffusers' preprocessing and latents, reference frames in its order."""
    from diffsynth.pipelines.wan_video.vace import VaceUnit

    ours, theirs = pipes
    video, mask, images = frames(1), mask_frames(True), [frames(2, 1)[0], frames(6, 1, size=(16, 40))[0]]

    def context(references):
        return VaceUnit().process(ours, video, mask, references, 32, 48, 5, 0, "cpu", None, None)["vace_context"]

    pixels, pixel_mask, fitted = theirs.preprocess_conditions(video, mask, images, 1, 32, 48, 5, torch.float32, "cpu")
    expected = torch.cat([theirs.prepare_video_latents(pixels, pixel_mask, fitted),
                          theirs.prepare_masks(pixel_mask, fitted)], dim=1)
    ours_context = context(images)
    assert ours_context.shape == expected.shape == (1, 96, 4, 4, 6)
    assert (ours_context - expected).abs().max() < 1e-5
    other = context([frames(5, 1)[0], images[1]])
    assert (other - ours_context)[:, :, 1].abs().max() > 0.1  # the first image is placed last, as diffusers does
    assert torch.equal(other[:, :, 0], ours_context[:, :, 0])


def test_a_reference_image_of_another_shape_is_fitted_on_a_white_canvas(pipes):
    ours, theirs = pipes
    tall = frames(6, 1, size=(16, 40))[0]
    assert (render(ours, references=tall) - reference(theirs, references=tall)).abs().max() < 1e-4


@pytest.mark.parametrize("model_id", [WAN_VACE_ORIGINAL_MODEL_ID, WAN_VACE_PREVIEW_MODEL_ID])
def test_original_release_loads_the_diffusers_weights(tiny_root, pipes, model_id):
    pipe = load(tiny_root, model_id, ORIGINAL[:1])
    ours, _ = pipes
    assert type(pipe.dit).__name__ == "WanVACETransformer3DModel"
    assert list(pipe.dit.config.vace_layers) == [0, 1] and pipe.dit.config.vace_in_channels == 96
    theirs = ours.dit.state_dict()
    assert all(torch.equal(tensor, theirs[key]) for key, tensor in pipe.dit.state_dict().items())
    assert set(pipe.dit.state_dict()) == set(theirs)


def test_wan22_vace_fun_runs_both_experts_as_diffusers_does(tiny_root, pipes):
    from diffusers import WanVACEPipeline

    pipe = load(tiny_root, WAN22_VACE_FUN_MODEL_ID, ("high_noise_model/diffusion_pytorch_model*.safetensors",
                                                     "low_noise_model/diffusion_pytorch_model*.safetensors",
                                                     *ORIGINAL[1:]))
    assert type(pipe.dit2).__name__ == "WanVACETransformer3DModel"
    assert not torch.equal(pipe.dit.vace_blocks[0].proj_in.weight, pipe.dit2.vace_blocks[0].proj_in.weight)
    ours, theirs = pipes
    pipe.scheduler = ours.scheduler
    # The same tiny text encoder and VAE as the diffusers repo's, with the two experts switching at the release's
    # boundary (the schedule's second step is below it).
    experts = WanVACEPipeline(tokenizer=theirs.tokenizer, text_encoder=theirs.text_encoder, vae=theirs.vae,
                              scheduler=theirs.scheduler, transformer=pipe.dit, transformer_2=pipe.dit2,
                              boundary_ratio=0.875)
    experts.set_progress_bar_config(disable=True)
    inputs = dict(video=frames(1), references=frames(2, 1)[0])
    video = render(pipe, **inputs)
    assert video.shape == (1, 5, 3, 32, 48)
    assert (video - reference(experts, **inputs)).abs().max() < 1e-4
    assert (video - render(pipe, boundary_ratio=0.1, **inputs)).abs().max() > 2e-3  # the low-noise expert matters


def test_bad_vace_input_is_refused_before_denoising(pipes, tiny_root):
    ours, _ = pipes
    with pytest.raises(ValueError, match="vace_video_mask was given without vace_video"):
        render(ours, mask=mask_frames(True))
    with pytest.raises(ValueError, match="vace_video has 3 frames, fewer than num_frames=5"):
        render(ours, video=frames(1, count=3))
    with pytest.raises(TypeError, match="vace_reference_image must be one PIL image"):
        render(ours, references="ref.png")
    plain = load(tiny_root, "Wan-AI/Wan2.1-T2V-1.3B", ORIGINAL[:1] + ORIGINAL[2:])
    with pytest.raises(ValueError, match="vace_video given, but the transformer .* has no VACE blocks"):
        render(plain, video=frames(1))


def test_vace_names_the_vace_modules_of_the_transformer_and_only_a_vace_one_has_them():
    from diffsynth.testing.tiny_wan import tiny_wan_transformer
    from diffsynth.testing.tiny_wan_vace import tiny_wan_vace_transformer
    from diffsynth.training.objective.lora_targets import scoped_targets

    vace = tiny_wan_vace_transformer(0)
    assert WanVideoPipeline.host_model("vace") == "dit"
    assert WanVideoPipeline.part_scope("vace", vace) == (("vace_blocks", "vace_patch_embedding"), ())
    assert WanVideoPipeline.part_scope("dit", vace) == ((), ("vace_blocks", "vace_patch_embedding"))
    assert WanVideoPipeline.part_scope("dit", tiny_wan_transformer(0)) == ((), ())
    inside = scoped_targets(vace, ["to_q"], *WanVideoPipeline.part_scope("vace", vace))
    outside = scoped_targets(vace, ["to_q"], *WanVideoPipeline.part_scope("dit", vace))
    assert inside == [f"vace_blocks.{i}.attn{j}.to_q" for i in range(2) for j in (1, 2)]
    assert outside == [f"blocks.{i}.attn{j}.to_q" for i in range(2) for j in (1, 2)]
    with pytest.raises(ValueError, match="vace is part of dit, but the loaded WanTransformer3DModel has no "
                                         "vace_blocks, vace_patch_embedding"):
        WanVideoPipeline.part_scope("vace", tiny_wan_transformer(0))


def test_units_do_what_they_declare_with_reference_images(pipes):
    from tests.pipelines.declarations import check_declarations

    ours, _ = pipes
    ours.scheduler.set_timesteps(2)
    shared = {"cfg_scale": 2.0, "height": 32, "width": 48, "num_frames": 5, "seed": 0, "rand_device": "cpu",
              "input_video": frames(0), "max_sequence_length": 16, "vace_video": frames(1),
              "vace_video_mask": mask_frames(True), "vace_reference_image": frames(2, 1)[0]}
    assert check_declarations(ours, shared, {"prompt": PROMPT}, {"negative_prompt": ""}) == {}
