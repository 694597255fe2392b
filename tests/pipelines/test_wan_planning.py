"""The memory planner's Wan releases without their files: each control release (VACE, Fun InP / Control /
Control-Camera, FLF2V) is named by its repository ids, and its denoiser takes the inputs ``wan_video/planning.py``
gives it on the meta device (the kit's planner test dry-runs one release of each class in full)."""

import pytest
import torch

from diffsynth.pipelines.registry import released_architecture
from diffsynth.training.placement.planner import build_architecture, denoiser_inputs

# A repository id of each release kind, with its release and the inputs beside the latents its denoiser reads.
RELEASES = {
    "PAI/Wan2.1-Fun-1.3B-InP": ("wan2.1-fun-inp-1.3b", {"encoder_hidden_states_image"}),
    "Wan-AI/Wan2.1-FLF2V-14B-720P": ("wan2.1-flf2v-14b", {"encoder_hidden_states_image"}),
    "PAI/Wan2.1-Fun-1.3B-Control": ("wan2.1-fun-control-1.3b", {"encoder_hidden_states_image"}),
    "PAI/Wan2.1-Fun-V1.1-14B-Control": ("wan2.1-fun-v1.1-control-14b",
                                        {"encoder_hidden_states_image", "reference_latents"}),
    "PAI/Wan2.1-Fun-V1.1-1.3B-Control-Camera": ("wan2.1-fun-v1.1-control-camera-1.3b",
                                                {"encoder_hidden_states_image", "camera_latents"}),
    "PAI/Wan2.2-Fun-A14B-InP": ("wan2.2-i2v-a14b", set()),
    "PAI/Wan2.2-Fun-A14B-Control": ("wan2.2-fun-a14b-control", {"reference_latents"}),
    "PAI/Wan2.2-Fun-A14B-Control-Camera": ("wan2.2-fun-a14b-control-camera", {"camera_latents"}),
    "PAI/Wan2.2-VACE-Fun-A14B": ("wan2.1-vace-14b", {"control_hidden_states"}),
}
ALWAYS = {"hidden_states", "encoder_hidden_states", "timestep", "return_dict"}


def test_each_control_release_is_named_by_its_ids():
    for model_id, (architecture, _) in RELEASES.items():
        assert released_architecture([model_id]) == architecture, model_id
    # The Control ids are exact, so that Control-Camera names one release.
    assert released_architecture(["PAI/Wan2.1-Fun-V1.1-1.3B-Control"]) == "wan2.1-fun-v1.1-control-1.3b"
    assert released_architecture(["Wan-AI/Wan2.1-I2V-14B-720P", "PAI/Wan2.1-Fun-14B-InP"]) == "wan2.1-i2v-14b"


@pytest.mark.parametrize("model_id", list(RELEASES))
def test_the_released_denoiser_takes_its_planner_inputs(model_id):
    """One block of the released widths (the planner builds them all; the forward is what a block adds), on the meta
    device: the inputs are the ones the pipeline passes, and the prediction is the latents' shape."""
    architecture, extra = RELEASES[model_id]
    model = build_architecture(architecture, torch.bfloat16)
    model.blocks = model.blocks[:1]
    if "vace_layers" in model.config:
        model.vace_blocks = model.vace_blocks[:1]
        model.register_to_config(vace_layers=[0])
    inputs = denoiser_inputs(model, 128, 128, 5, torch.bfloat16)
    assert set(inputs) - ALWAYS - {"control_hidden_states_scale"} == extra
    output = model(**inputs)[0]
    assert output.shape == (1, 16, 2, 16, 16) and output.device.type == "meta"


def test_each_fun_release_has_the_structure_of_its_tiny_repo():
    """The planner's configs against the tiny Fun repos, which copy each release's structure (input width, CLIP,
    ref_conv, camera adapter), sizes aside."""
    from diffsynth.pipelines.registry import releases
    from diffsynth.testing.tiny_wan_fun import FUN_RELEASES, tiny_fun_transformer

    for model_id, structure in FUN_RELEASES.items():
        config = releases()[released_architecture([model_id])][1].config
        tiny = tiny_fun_transformer(structure, 0).config
        for key in ("in_channels", "reference_conv", "camera_channels"):
            assert (config.get(key) or None) == (tiny.get(key) or None), (model_id, key)  # unset, False: none
        assert (config.get("image_dim") is None) == (tiny.image_dim is None), model_id
