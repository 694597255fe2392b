"""The Wan control variants under the trainer's placements: a LoRA step of VACE (on ``dit`` and on the ``vace`` blocks),
Fun Control (V1.1, with its reference image), Fun Control-Camera (V1.1) and FLF2V gives the plain run's LoRA with
model CPU offload, block swap (VACE's blocks swapped too) and H2D block streaming (each placement on the cases whose
code it changes); fp8 storage of the frozen weights computes the plain loss and holds each variant's control layers in
fp8; the split run (stage one caches the VACE context, the Fun control latents and camera embedding, FLF2V's two
images' CLIP tokens) gives the one-stage LoRA; samples while training render each variant's control inputs. The runs
are the family kit's (``family_helpers.Runs``) on each variant's tiny repo and drawn control dataset.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from diffsynth.core.data.example_dataset import build_example_video_dataset
from diffsynth.core.fp8 import holds_fp8_layers, store_model_in_fp8
from diffsynth.pipelines.registry import family
from diffsynth.pipelines.wan_video.example_vace import build_vace_example_dataset
from diffsynth.testing.families import TinyFamily
from diffsynth.testing.tiny_wan import WAN_PATTERNS
from diffsynth.testing.tiny_wan_flf2v import WAN_FLF2V_MODEL_ID, WAN_FLF2V_PATTERNS
from diffsynth.testing.tiny_wan_fun import build_tiny_wan_fun
from diffsynth.testing.tiny_wan_vace import WAN_VACE_MODEL_ID
from tests.examples.test_wan_fun_scripts import control_dataset
from tests.pipelines.family_helpers import PLACEMENTS, Runs, load_ours, lora_file
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
# The placements each case runs. Offload and H2D streaming are generic hooks around whole models and blocks: one case
# each proves them with a control variant (offload with Fun's reference image, H2D streaming with both of VACE's block
# lists and the LoRA on the VACE blocks). Block swap is what VACE's second block list changes, so both VACE cases run
# it; the Fun and FLF2V control layers lie outside the blocks, which block swap leaves resident (their blocks are plain
# Wan blocks, swapped in the family kit).
PLACED = {("vace", "dit"): ("block_swap",), ("vace", "vace"): ("block_swap", "h2d_streaming"),
          ("fun_control", "dit"): ("offload",)}
PLACED_CASES = [(case, placement) for case, placements in PLACED.items() for placement in placements]


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


def _sample_flags(runs: Runs) -> list[str]:
    """The flags that render the variant's two sample entries after the epoch (the LoRA is saved before)."""
    for index, color in enumerate(((250, 20, 20), (20, 20, 250))):
        Image.new("RGB", (32, 32), color).save(runs.data / f"last_{index}.png")
    Image.new("RGB", (32, 32), (20, 200, 20)).save(runs.data / "first.png")
    entries = [{"prompt": "a ring", "height": 32, "width": 32, "num_frames": 5, **inputs}
               for inputs in SAMPLES[runs.tiny.model_id]]
    (runs.data / "prompts.json").write_text(json.dumps(entries))
    return ["--validation_prompts", str(runs.data / "prompts.json"), "--validation_epochs", "1",
            "--validation_num_inference_steps", "2"]


@pytest.fixture(scope="module")
def case_runs(tmp_path_factory, tiny_root, fun_root):
    """``case_runs(variant, base)``: the runs of one case, made once per module so that its plain run is shared; the
    plain run of a LoRA on ``dit`` renders the samples too (after the epoch: the placed runs match it without them)."""
    made = {}

    def runs(variant: str, base: str = "dit") -> Runs:
        if (variant, base) not in made:
            folder = tmp_path_factory.mktemp(f"{variant}_{base}")
            root = fun_root if variant.startswith("fun") else tiny_root
            made[variant, base] = Runs(family("wan_video"), VARIANTS[variant], _dataset(variant, folder / "data"),
                                       folder, root, base)
            if base == "dit":
                made[variant, base].lora("plain", *_sample_flags(made[variant, base]))
        return made[variant, base]

    return runs


@pytest.mark.slow
@pytest.mark.parametrize(("case", "placement"), PLACED_CASES,
                         ids=[f"{variant}-{base}-{placement}" for (variant, base), placement in PLACED_CASES])
def test_offload_and_block_swap_give_the_plain_lora(case_runs, case, placement):
    runs = case_runs(*case)
    placed = runs.lora(placement, *PLACEMENTS[placement](runs.tiny))
    plain = lora_file(runs.lora("plain"))
    assert max(value.abs().max().item() for key, value in plain.items() if "lora_B" in key) > 1e-4
    assert max_difference(lora_file(placed), plain) < runs.tiny.lora_tolerance


@pytest.mark.slow
def test_fp8_storage_computes_the_plain_loss(case_runs):
    """fp8 weights round the forward (Adam then turns small gradient differences into whole steps, so the LoRA files
    are not compared): the first step's loss is the plain run's within 1%. One variant's run proves the trainer's
    wiring; each variant's control layers are checked on the built model below."""
    runs = case_runs("vace")
    runs.lora("fp8", "--fp8_models", runs.tiny.models["dit"])
    runs.lora("plain")
    fp8, plain = runs.results["fp8"], runs.results["plain"]
    assert abs(fp8["losses"][0] - plain["losses"][0]) < 0.01 * plain["losses"][0]
    assert all(torch.isfinite(torch.tensor(fp8["losses"])))
    assert holds_fp8_layers(fp8["module"].pipe.dit.get_submodule(CONTROL_LAYERS[WAN_VACE_MODEL_ID][0]))
    trained = lora_file(runs.folder / "fp8")
    assert max(value.abs().max().item() for key, value in trained.items() if "lora_B" in key) > 1e-4


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fp8_storage_holds_the_control_layers_in_fp8(variant, tiny_root, fun_root):
    """The control inputs' own layers are stored in fp8 too, as nothing in their forward casts its input to their
    weight dtype (the forward with every control input runs, within fp8's rounding of the full-precision one), while
    the time embedder (diffusers' ``_keep_in_fp32_modules``) keeps its dtype."""
    from diffsynth.pipelines.wan_video.planning import planner_inputs

    tiny = VARIANTS[variant]
    dit = load_ours(fun_root if variant.startswith("fun") else tiny_root, tiny, [tiny.models["dit"]]).dit
    dit.requires_grad_(False)
    generator = torch.Generator().manual_seed(0)
    inputs = {key: torch.randn(value.shape, generator=generator) if isinstance(value, torch.Tensor) else value
              for key, value in planner_inputs(dit, 32, 32, 5, torch.float32, 1, 8).items()}
    inputs["timestep"] = torch.tensor([500.0])
    if "encoder_hidden_states_image" in inputs:  # the tiny CLIP's 17 tokens per image, not the release's 257
        images = inputs["encoder_hidden_states_image"]
        inputs["encoder_hidden_states_image"] = images[:, :17].contiguous()
    with torch.no_grad():
        full = dit(**inputs)[0]
        store_model_in_fp8(dit)
        rounded = dit(**inputs)[0]
    assert type(dit.condition_embedder.time_embedder.linear_1) is torch.nn.Linear
    for name in CONTROL_LAYERS[tiny.model_id]:
        assert holds_fp8_layers(dit.get_submodule(name)), name
    error = ((rounded - full).norm() / full.norm()).item()
    assert 1e-4 < error < 0.06, error  # fp8's rounding, measured 3.4% to 3.9%: in effect, and no more


SPLIT_CASES = [case for case in CASES if case != ("vace", "vace")]  # the same cache; the LoRA's base is run above


@pytest.mark.slow
@pytest.mark.parametrize("case", SPLIT_CASES, ids=[f"{variant}-{base}" for variant, base in SPLIT_CASES])
def test_split_training_gives_the_one_stage_lora(case_runs, case):
    """Stage one caches the control inputs' encodings, stage two trains from the cache alone. VACE's context needs
    the VAE alone; the Fun control latents are laid out by the transformer's input width and FLF2V's CLIP tokens
    (both images', where Fun InP's are the first image's) by its image positions, so their first stage loads the
    transformer too, frozen."""
    runs = case_runs(*case)
    needs_transformer = runs.tiny.model_id != WAN_VACE_MODEL_ID
    stage_one, output = runs.split(runs.tiny.model_flag if needs_transformer else None)
    assert stage_one["cached"] == 2
    assert max_difference(lora_file(output), lora_file(runs.lora("plain"))) < runs.tiny.split_tolerance


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_samples_while_training_render_with_the_control_inputs(case_runs, variant):
    """Each sample entry's control inputs reach the render: two entries differing in one of them give two clips (a
    VACE run's samples do not depend on the LoRA's base)."""
    clips = sorted((case_runs(variant).lora("plain") / "samples").glob("*/*.mp4"))
    assert [path.name for path in clips] == ["00.mp4", "01.mp4"]
    first, second = (_decoded(path) for path in clips)
    assert first.shape == second.shape == (5, 32, 32, 3)
    assert np.abs(first - second).max() > 4  # measured 12 (VACE) to 38 (FLF2V) levels of 255
