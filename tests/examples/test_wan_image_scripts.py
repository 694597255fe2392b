"""The reference's Wan LoRA scripts for first-last-frame models (Wan2.1-FLF2V, the Fun InP releases) and the plain
ones added with them (Wan2.1-T2V-14B, I2V-14B-720P, fp8 training, direct distillation) run as written on the tiny
original-layout repos, through the trainer's ``main`` (see ``test_wan_scripts``); a LoRA trained on FLF2V loads
fully in diffusers' ``WanImageToVideoPipeline`` and renders there what the merged LoRA renders here.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from peft.utils import get_peft_model_state_dict

from diffsynth.core.data.example_dataset import build_example_video_dataset
from diffsynth.lora import load_lora, read_lora
from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
from diffsynth.testing.tiny_models import WAN22_I2V_MODEL_ID, WAN_I2V_ORIGINAL_MODEL_ID, WAN_ORIGINAL_MODEL_ID
from diffsynth.testing.tiny_wan_flf2v import WAN_FLF2V_MODEL_ID, WAN_FLF2V_PATTERNS
from tests.conftest import load_lora_into_diffusers
from tests.examples.helpers import linked_model_root
from tests.pipelines.test_wan_flf2v import FLF2V_MODELS, diffusers_twin
from tests.pipelines.test_wan_i2v import configs, picture, reference_schedule

from .test_wan_scripts import VIDEO, WAN, run_script

# Releases laid out, named and shaped as a tiny repo (sizes aside): the PAI Fun InP repos hold a Wan2.1 / Wan2.2
# image-to-video DiT (in_dim 36; CLIP for Wan2.1) beside the same encoder files, as the reference's configs read them.
WAN_ALIASES = {
    "Wan-AI/Wan2.1-T2V-14B": WAN_ORIGINAL_MODEL_ID, "Wan-AI/Wan2.1-I2V-14B-720P": WAN_I2V_ORIGINAL_MODEL_ID,
    "PAI/Wan2.1-Fun-1.3B-InP": WAN_I2V_ORIGINAL_MODEL_ID, "PAI/Wan2.1-Fun-14B-InP": WAN_I2V_ORIGINAL_MODEL_ID,
    "PAI/Wan2.1-Fun-V1.1-1.3B-InP": WAN_I2V_ORIGINAL_MODEL_ID, "PAI/Wan2.1-Fun-V1.1-14B-InP": WAN_I2V_ORIGINAL_MODEL_ID,
    "PAI/Wan2.2-Fun-A14B-InP": WAN22_I2V_MODEL_ID,
}  # fmt: skip


@pytest.fixture(scope="module")
def model_root(tiny_root, tmp_path_factory) -> Path:
    return linked_model_root(tiny_root, tmp_path_factory.mktemp("wan_image_model_root"), WAN_ALIASES)


def assert_trained(result: dict) -> None:
    assert result["global_step"] == 2 and all(torch.isfinite(torch.tensor(result["losses"])))


@pytest.mark.parametrize("kind", ["lora", "full"])
@pytest.mark.parametrize("size", ["1.3B", "14B"])
def test_the_v1_1_fun_inp_scripts_are_the_first_releases_commands_on_their_own_files(kind, size):
    # The reference's V1.1 commands differ from the first release's in the repository id alone, so the runs of the
    # first release's scripts (here and in test_wan_full_scripts) stand for theirs.
    first, v11 = f"Wan2.1-Fun-{size}-InP", f"Wan2.1-Fun-V1.1-{size}-InP"
    assert (WAN / kind / f"{v11}.sh").read_text() == (WAN / kind / f"{first}.sh").read_text().replace(first, v11)


@pytest.mark.parametrize("name", ["Wan2.1-Fun-1.3B-InP", "Wan2.1-Fun-14B-InP"])
def test_fun_inp_lora_scripts_train_on_the_first_and_last_frames(workdir, name):
    (result,) = run_script(f"lora/{name}.sh", VIDEO)
    assert_trained(result)
    pipe = result["module"].pipe
    assert pipe.model_configs["dit"].model_id == f"PAI/{name}" and pipe.image_encoder is not None
    assert (workdir / f"models/train/{name}_lora/epoch-0.safetensors").is_file()


def test_wan22_fun_inp_trains_each_expert(workdir):
    high, low = run_script("lora/Wan2.2-Fun-A14B-InP.sh", VIDEO)
    for result, folder in ((high, "high_noise_model"), (low, "low_noise_model")):
        assert_trained(result)
        assert result["module"].pipe.model_configs["dit"].origin_file_pattern.startswith(folder)
    assert (high["module"].loss.max_timestep_boundary, low["module"].loss.min_timestep_boundary) == (0.358, 0.358)


@pytest.mark.parametrize(("script", "output"), [("lora/Wan2.1-T2V-14B.sh", "Wan2.1-T2V-14B_lora"),
                                                ("lora/Wan2.1-I2V-14B-720P.sh", "Wan2.1-I2V-14B-720P_lora"),
                                                ("special/fp8_training/Wan2.1-I2V-14B-480P.sh",
                                                 "Wan2.1-I2V-14B-480P_lora_fp8")])
def test_plain_scripts_train(workdir, script, output):
    (result,) = run_script(script, VIDEO)
    assert_trained(result)
    assert (workdir / f"models/train/{output}/epoch-0.safetensors").is_file()
    if "fp8" in script:
        pipe = result["module"].pipe
        assert pipe.text_encoder.encoder.block[0].layer[0].SelfAttention.q.weight.dtype == torch.float8_e4m3fn


def test_direct_distill_script_trains_the_whole_transformer(workdir):
    folder = workdir / "data/example_distill_video_dataset"
    metadata = build_example_video_dataset(folder, num_videos=2, num_frames=6, size=(48, 32))
    with metadata.open(newline="") as file:
        rows = list(csv.DictReader(file))
    with metadata.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["video", "prompt", "seed", "rand_device", "num_inference_steps", "cfg_scale"])
        writer.writerows([row["video"], row["prompt"], seed, "cpu", 2, cfg] for row, seed, cfg in
                         zip(rows, (0, 7), (1.0, 2.5)))
    (result,) = run_script("special/direct_distill/Wan2.1-T2V-1.3B.sh", VIDEO)
    assert_trained(result)
    assert type(result["module"].loss).__name__ == "DirectDistillLoss"
    assert any(workdir.glob("models/train/Wan2.1-T2V-1.3B_full_distill/epoch-0*"))


def test_flf2v_lora_loads_fully_into_diffusers_at_the_trained_strength(workdir, model_root):
    (result,) = run_script("lora/Wan2.1-FLF2V-14B-720P.sh", VIDEO)
    assert_trained(result)
    lora = workdir / "models/train/Wan2.1-FLF2V-14B-720P_lora/epoch-0.safetensors"
    models = configs(WAN_FLF2V_MODEL_ID, WAN_FLF2V_PATTERNS, *FLF2V_MODELS)
    merged = WanVideoPipeline.from_pretrained(torch.float32, "cpu", models)
    layers = set(read_lora(lora).layers)
    assert load_lora(merged.dit, lora) == len(layers)
    theirs = diffusers_twin(WanVideoPipeline.from_pretrained(torch.float32, "cpu", models))
    kwargs = dict(image=picture(0), last_image=picture(5), prompt="a red cat", height=32, width=48, num_frames=5,
                  num_inference_steps=2, guidance_scale=1.0, output_type="pt")
    before = theirs(**kwargs, generator=torch.Generator().manual_seed(0)).frames
    assert load_lora_into_diffusers(theirs, lora, "flf2v") == []  # no key left over, none missing
    loaded = get_peft_model_state_dict(theirs.transformer, adapter_name="flf2v")
    padded = {key for key in loaded if key.rsplit(".lora_", 1)[0] not in layers}
    assert {key.rsplit(".lora_", 1)[0] for key in loaded} >= layers
    # diffusers gives a LoRA without the image projections zero ones for them (an image-to-video transformer)
    assert {key.split(".")[3] for key in padded} == {"add_k_proj", "add_v_proj"}
    assert not any(loaded[key].any() for key in padded if ".lora_B." in key)
    after = theirs(**kwargs, generator=torch.Generator().manual_seed(0)).frames
    with reference_schedule(merged, theirs):
        ours = merged("a red cat", cfg_scale=1.0, input_image=picture(0), end_image=picture(5), seed=0,
                      rand_device="cpu", height=32, width=48, num_frames=5, num_inference_steps=2, output_type="pt",
                      progress_bar=False)
    assert (ours - after).abs().max() < 1e-4  # diffusers at the default strength renders the merged LoRA
    assert (after - before).abs().max() > 1e-5  # and the LoRA changed something
