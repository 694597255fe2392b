"""Z-Image-Turbo Fun ControlNets: the released single file read into diffusers' ``ZImageControlNetModel``, and
generation with a control image equal to diffusers' ``ZImageControlNetPipeline``."""

import pytest
import torch
from PIL import Image, ImageDraw

from diffsynth.pipelines.z_image import ControlNetInput
from diffsynth.testing.tiny_z_image import Z_IMAGE_PATTERNS, Z_IMAGE_TURBO_MODEL_ID
from diffsynth.testing.tiny_z_image_controlnet import (
    CONTROLNET_CONFIG,
    Z_IMAGE_CONTROLNET_FILES,
    Z_IMAGE_CONTROLNET_MODEL_ID,
)
from tests.pipelines.family_helpers import load_ours

PROMPT, NEGATIVE = "a red cube on a blue table", "blurry"
SIZE = dict(height=48, width=64)
UNION, TILE = list(Z_IMAGE_CONTROLNET_FILES)[0], list(Z_IMAGE_CONTROLNET_FILES)[2]


def entries(controlnet_file):
    turbo = [f"{Z_IMAGE_TURBO_MODEL_ID}:{Z_IMAGE_PATTERNS[name]}" for name in ("dit", "text_encoder", "vae")]
    return [f"{Z_IMAGE_CONTROLNET_MODEL_ID}:{controlnet_file}", *turbo]


def control(color):
    """A control image with structure (a gradient and a square), at the output size."""
    image = Image.linear_gradient("L").resize((SIZE["width"], SIZE["height"])).convert("RGB")
    ImageDraw.Draw(image).rectangle((6, 6, 30, 26), fill=color)
    return image


def theirs_for(tiny_root, controlnet_file):
    """diffusers' ControlNet pipeline on Turbo's parts, its ControlNet built from the builder's config (not from our
    reader) and loaded from the released file."""
    from diffusers import ZImageControlNetModel, ZImageControlNetPipeline, ZImagePipeline
    from safetensors.torch import load_file

    base = ZImagePipeline.from_pretrained(str(tiny_root / Z_IMAGE_TURBO_MODEL_ID), dtype=torch.float32)
    controlnet = ZImageControlNetModel(**CONTROLNET_CONFIG)
    controlnet.load_state_dict(load_file(str(tiny_root / Z_IMAGE_CONTROLNET_MODEL_ID / controlnet_file)))
    pipe = ZImageControlNetPipeline(**base.components, controlnet=controlnet)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def pipes(tiny_root):
    return load_ours(tiny_root, "z_image", entries(UNION)), theirs_for(tiny_root, UNION)


def render_ours(pipe, image, scale, seed=7, **kwargs):
    return pipe(PROMPT, negative_prompt=NEGATIVE, controlnet_inputs=[ControlNetInput(image=image, scale=scale)],
                seed=seed, output_type="pt", progress_bar=False, **SIZE, **kwargs)


@pytest.mark.parametrize(("guidance", "scale"), [(0.0, 0.7), (2.0, 1.0)])
def test_matches_diffusers_controlnet_pipeline(pipes, guidance, scale):
    ours, theirs = pipes
    image = render_ours(ours, control((200, 40, 90)), scale, cfg_scale=guidance + 1, num_inference_steps=3)
    reference = theirs(PROMPT, negative_prompt=NEGATIVE, control_image=control((200, 40, 90)),
                       controlnet_conditioning_scale=scale, guidance_scale=guidance, num_inference_steps=3,
                       generator=torch.Generator().manual_seed(7), output_type="pt", **SIZE).images
    assert image.shape == reference.shape == (1, 3, 48, 64)
    assert (image - reference).abs().max() < 1e-4
    # Teeth: another control image, and no ControlNet at all, move the output far beyond the tolerance.
    other = render_ours(ours, control((20, 220, 40)), scale, cfg_scale=guidance + 1, num_inference_steps=3)
    off = render_ours(ours, control((200, 40, 90)), 0.0, cfg_scale=guidance + 1, num_inference_steps=3)
    assert (other - reference).abs().max() > 1e-2 and (off - reference).abs().max() > 1e-2


def test_the_reader_recovers_the_config_and_keeps_the_transformer_out(pipes, tiny_root):
    from safetensors.torch import load_file

    ours, _ = pipes
    controlnet = ours.controlnet
    assert type(controlnet).__name__ == "ZImageControlNetModel"
    assert {key: controlnet.config[key] for key in CONTROLNET_CONFIG} == CONTROLNET_CONFIG
    assert ours.denoising_model_names == ("dit", "controlnet")
    # The transformer's parts it computes with are lent, not its own: its state dict is the released file's.
    released = load_file(str(tiny_root / Z_IMAGE_CONTROLNET_MODEL_ID / UNION))
    state = controlnet.state_dict()
    assert set(state) == set(released)
    assert all(torch.equal(state[key], released[key]) for key in released)
    # Each of the release's three files reads as the same architecture; a transformer file is not taken for one.
    from diffsynth.pipelines.z_image.original import identify

    for name in Z_IMAGE_CONTROLNET_FILES:
        found = identify([tiny_root / Z_IMAGE_CONTROLNET_MODEL_ID / name])
        assert found.class_name == "ZImageControlNetModel" and found.config == CONTROLNET_CONFIG
    assert identify(sorted((tiny_root / Z_IMAGE_TURBO_MODEL_ID / "vae").glob("*.safetensors"))) is None


def test_the_tile_controlnet_loads_and_steers(tiny_root):
    pipe = load_ours(tiny_root, "z_image", entries(TILE))
    low = control((90, 90, 200)).resize((16, 12)).resize((SIZE["width"], SIZE["height"]))
    with_tile = render_ours(pipe, low, 1.0, num_inference_steps=2)
    without = pipe(PROMPT, seed=7, output_type="pt", progress_bar=False, num_inference_steps=2, **SIZE)
    assert (with_tile - without).abs().max() > 1e-2


def test_bad_control_input_is_named(pipes, tiny_root):
    ours, _ = pipes
    image = control((1, 2, 3))
    with pytest.raises(ValueError, match=r"inpaint_image=\.\.\., inpaint_mask=\.\.\.\) is not supported"):
        ours(PROMPT, controlnet_inputs=[ControlNetInput(inpaint_image=image, inpaint_mask=image)], **SIZE)
    with pytest.raises(ValueError, match=r"start=0.5, end=0.0, processor_id=None\) is not supported here"):
        ours(PROMPT, controlnet_inputs=[ControlNetInput(image=image, start=0.5)], **SIZE)
    with pytest.raises(ValueError, match="must be one ControlNetInput"):
        ours(PROMPT, controlnet_inputs=[ControlNetInput(image=image)] * 2, **SIZE)
    plain = load_ours(tiny_root, "z_image", entries(UNION)[1:])
    with pytest.raises(ValueError, match="Z-Image-Turbo-Fun-Controlnet-Union-2.1.safetensors"):
        plain(PROMPT, controlnet_inputs=[ControlNetInput(image=image)], num_inference_steps=1, **SIZE)


def test_units_do_what_they_declare(pipes):
    from tests.pipelines.declarations import check_declarations

    ours, _ = pipes
    ours.scheduler.set_timesteps(2, 0.5)
    shared = {"cfg_scale": 2.0, "height": 32, "width": 32, "seed": 0, "rand_device": "cpu",
              "controlnet_image": control((1, 2, 3)), "input_image": control((9, 9, 9)).resize((32, 32)),
              "denoising_strength": 0.5, "max_sequence_length": 64}
    assert check_declarations(ours, shared, {"prompt": PROMPT}, {"negative_prompt": NEGATIVE}) == {}
