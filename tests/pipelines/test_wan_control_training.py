"""The Wan control variants under the trainer's placements: a LoRA step of VACE (on ``dit`` and on the ``vace`` blocks),
Fun Control (V1.1, with its reference image), Fun Control-Camera (V1.1) and FLF2V gives the plain run's LoRA with
model CPU offload, block swap (VACE's blocks swapped too), H2D block streaming, and computes the plain loss with fp8
storage of the frozen weights; the split run (stage one caches the VACE context, the Fun control latents and camera
embedding, FLF2V's two images' CLIP tokens) gives the one-stage LoRA; samples while training render each variant's
control inputs. The runs are the family kit's (``family_helpers.Runs``) on each variant's tiny repo and drawn control
dataset.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from diffsynth.core.data.example_dataset import build_example_video_dataset
from diffsynth.pipelines.registry import family
from diffsynth.pipelines.wan_video.example_vace import build_vace_example_dataset
from diffsynth.testing.families import TinyFamily
from diffsynth.testing.tiny_wan import WAN_PATTERNS
from diffsynth.testing.tiny_wan_flf2v import WAN_FLF2V_MODEL_ID, WAN_FLF2V_PATTERNS
from diffsynth.testing.tiny_wan_fun import build_tiny_wan_fun
from diffsynth.testing.tiny_wan_vace import WAN_VACE_MODEL_ID
from tests.examples.test_wan_fun_scripts import control_dataset
from tests.pipelines.family_helpers import PLACEMENTS, Runs, lora_file
from tests.training.conftest import max_difference

FUN_CONTROL, FUN_CAMERA = "PAI/Wan2.1-Fun-V1.1-1.3B-Control", "PAI/Wan2.1-Fun-V1.1-1.3B-Control-Camera"
ORIGINAL = {"dit": "diffusion_pytorch_model*.safetensors", "text_encoder": "models_t5_umt5-xxl-enc-bf16.pth",
            "vae": "Wan2.1_VAE.pth", "image_encoder": WAN_FLF2V_PATTERNS["image_encoder"]}
TARGETS = "q,k,v,o,ffn.0,ffn.2"


def _row(model_id: str, patterns: dict[str, str], inputs: str, files: bool = True, blocks: int = 1) -> TinyFamily:
    """A Wan ``TinyFamily`` row of a control variant: its models, the dataset columns it reads as inputs (files
    beside the clip where ``files``, else frames of the clip) and the blocks its block-swapped run swaps."""
    flags = ("--num_frames", "5", "--extra_inputs", inputs, *(("--data_file_keys", f"video,{inputs}") if files else ()))
    # Adam's normalisation scales up last-bit differences of near-zero gradients (measured up to 4e-6: the
    # cross-attention keys of the tiny prompt), as for FLUX.2 in the kit.
    return TinyFamily(name="wan_video", model_id=model_id, video=True, diffusers_pipeline="", lora_targets=TARGETS,
                      models={slot: f"{model_id}:{pattern}" for slot, pattern in patterns.items()}, train_flags=flags,
                      blocks_to_swap=blocks, lora_tolerance=1e-5)


VARIANTS = {
    "vace": _row(WAN_VACE_MODEL_ID, {slot: WAN_PATTERNS[slot] for slot in ("dit", "text_encoder", "vae")},
                 "vace_video,vace_reference_image", blocks=3),  # 3 of 2 VACE blocks and 2 blocks: both kinds
    "fun_control": _row(FUN_CONTROL, ORIGINAL, "control_video,reference_image"),
    # The camera motion is text in the metadata; the first frame is the clip's.
    "fun_camera": _row(FUN_CAMERA, ORIGINAL, "input_image,camera_control_direction,camera_control_speed", files=False),
    "flf2v": _row(WAN_FLF2V_MODEL_ID, ORIGINAL, "input_image,end_image", files=False),
}
# The layers that read each variant's control inputs.
CONTROL_LAYERS = {WAN_VACE_MODEL_ID: ("vace_patch_embedding", "vace_blocks.0.proj_in"), FUN_CONTROL: ("ref_conv",),
                  FUN_CAMERA: ("control_adapter.conv", "control_adapter.residual_blocks.0.conv1"),
                  WAN_FLF2V_MODEL_ID: ("condition_embedder.image_embedder.ff.net.0.proj",)}
# (variant, --lora_base_model): VACE trains either the main blocks or its own.
CASES = [("vace", "dit"), ("vace", "vace"), ("fun_control", "dit"), ("fun_camera", "dit"), ("flf2v", "dit")]


def _dataset(variant: str, folder: Path) -> Path:
    if variant == "vace":
        build_vace_example_dataset(folder, num_videos=2, num_frames=6, size=(32, 32))
    elif variant.startswith("fun"):
        control_dataset(folder)
    else:
        build_example_video_dataset(folder, num_videos=2, num_frames=6, size=(32, 32))
    return folder


@pytest.fixture(scope="module")
def fun_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fun_models")
    for model_id in (FUN_CONTROL, FUN_CAMERA):
        build_tiny_wan_fun(root, model_id)
    return root


@pytest.fixture(scope="module", params=CASES, ids=[f"{variant}-{base}" for variant, base in CASES])
def runs(request, tmp_path_factory, tiny_root, fun_root):
    variant, base = request.param
    folder = tmp_path_factory.mktemp(f"{variant}_{base}")
    root = fun_root if variant.startswith("fun") else tiny_root
    return Runs(family("wan_video"), VARIANTS[variant], _dataset(variant, folder / "data"), folder, root, base)


@pytest.mark.slow
@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_offload_and_block_swap_give_the_plain_lora(runs, placement):
    placed = runs.lora(placement, *PLACEMENTS[placement](runs.tiny))
    plain = lora_file(runs.lora("plain"))
    assert max(value.abs().max().item() for key, value in plain.items() if "lora_B" in key) > 1e-4
    assert max_difference(lora_file(placed), plain) < runs.tiny.lora_tolerance


@pytest.mark.slow
def test_fp8_storage_computes_the_plain_loss_with_the_control_layers_in_fp8(runs):
    """fp8 weights round the forward (Adam then turns small gradient differences into whole steps, so the LoRA files
    are not compared): the first step's loss is the plain run's within 1%; the control inputs' own layers are stored
    in fp8 too, as nothing in their forward casts its input to their weight dtype, while the time embedder (diffusers'
    ``_keep_in_fp32_modules``) keeps its dtype."""
    from diffsynth.core.fp8 import holds_fp8_layers

    runs.lora("fp8", "--fp8_models", runs.tiny.models["dit"])
    runs.lora("plain")
    fp8, plain = runs.results["fp8"], runs.results["plain"]
    assert abs(fp8["losses"][0] - plain["losses"][0]) < 0.01 * plain["losses"][0]
    assert all(torch.isfinite(torch.tensor(fp8["losses"])))
    dit = fp8["module"].pipe.dit
    assert type(dit.condition_embedder.time_embedder.linear_1) is torch.nn.Linear
    for name in CONTROL_LAYERS[runs.tiny.model_id]:
        assert holds_fp8_layers(dit.get_submodule(name)), name
    assert max(value.abs().max().item() for key, value in lora_file(runs.folder / "fp8").items() if "lora_B" in key) > 1e-4


@pytest.mark.slow
def test_split_training_gives_the_one_stage_lora(runs):
    """Stage one caches the control inputs' encodings, stage two trains from the cache alone. VACE's context needs
    the VAE alone; the Fun control latents are laid out by the transformer's input width and FLF2V's CLIP tokens
    (both images', where Fun InP's are the first image's) by its image positions, so their first stage loads the
    transformer too, frozen."""
    needs_transformer = runs.tiny.model_id != WAN_VACE_MODEL_ID
    stage_one, output = runs.split(runs.tiny.model_flag if needs_transformer else None)
    assert stage_one["cached"] == 2
    assert max_difference(lora_file(output), lora_file(runs.lora("plain"))) < runs.tiny.split_tolerance



# Two sample entries per variant, differing in one control input; file names are those the datasets hold.
SAMPLES = {
    WAN_VACE_MODEL_ID: [{"vace_video": "vace_000.mp4", "vace_reference_image": "reference_000.png"},
                        {"vace_video": "vace_001.mp4", "vace_reference_image": "reference_000.png"}],
    FUN_CONTROL: [{"control_video": "video_000.mp4", "reference_image": "reference_0.png"},
                  {"control_video": "video_001.gif", "reference_image": "reference_0.png"}],
    FUN_CAMERA: [{"input_image": "first.png", "camera_control_direction": "Left", "camera_control_speed": 0.05},
                 {"input_image": "first.png", "camera_control_direction": "Up", "camera_control_speed": 0.05}],
    WAN_FLF2V_MODEL_ID: [{"input_image": "first.png", "end_image": "last_0.png"},
                         {"input_image": "first.png", "end_image": "last_1.png"}],
}


def _decoded(path: Path) -> np.ndarray:
    import av

    with av.open(str(path)) as container:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]).astype(np.int16)


@pytest.mark.slow
def test_samples_while_training_render_with_the_control_inputs(runs):
    """Each sample entry's control inputs reach the render: two entries differing in one of them give two clips."""
    if runs.lora_base_model == "vace":
        pytest.skip("the samples of a VACE run are those of vace-dit: the LoRA's base does not change them")
    for index, color in enumerate(((250, 20, 20), (20, 20, 250))):
        Image.new("RGB", (32, 32), color).save(runs.data / f"last_{index}.png")
    Image.new("RGB", (32, 32), (20, 200, 20)).save(runs.data / "first.png")
    entries = [{"prompt": "a ring", "height": 32, "width": 32, "num_frames": 5, **inputs}
               for inputs in SAMPLES[runs.tiny.model_id]]
    (runs.data / "prompts.json").write_text(json.dumps(entries))
    output = runs.lora("samples", "--validation_prompts", str(runs.data / "prompts.json"), "--validation_epochs", "1",
                       "--validation_num_inference_steps", "2")
    clips = sorted((output / "samples").glob("*/*.mp4"))
    assert [path.name for path in clips] == ["00.mp4", "01.mp4"]
    first, second = (_decoded(path) for path in clips)
    assert first.shape == second.shape == (5, 32, 32, 3)
    assert np.abs(first - second).max() > 4  # measured 12 (VACE) to 38 (FLF2V) levels of 255
