"""The reference's Wan Fun Control and Control-Camera scripts (DiffSynth-Studio fed7b18,
``examples/wanvideo/model_training/{lora,full}/Wan2.*-Fun-*Control*.sh``) run as written on tiny PAI repos through the
trainer's ``main``, and a LoRA of the Fun 1.0 Control transformer (diffusers' own ``WanTransformer3DModel``) loads
whole into diffusers' ``WanImageToVideoPipeline`` holding it.

Only what a user on a small machine changes is changed: sizes, epochs, repeats, and ``DIFFSYNTH_MODEL_BASE_PATH``
pointing at the tiny repos (the 14B releases are aliases of the 1.3B repos of the same structure). The dataset is drawn
at the path each script names, with the columns the reference's example datasets have: ``control_video``,
``reference_image``, ``camera_control_direction`` and ``camera_control_speed``.
"""

from __future__ import annotations

import copy
import csv
from pathlib import Path

import pytest
import torch
from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
from PIL import Image

from diffsynth.core.data.example_dataset import build_example_video_dataset
from diffsynth.core.loader import ModelConfig, load_model
from diffsynth.lora import read_lora
from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
from diffsynth.testing.tiny_wan_fun import FUN_ALIASES, FUN_RELEASES, build_tiny_wan_fun_repos
from diffsynth.training import entry as trainer
from tests.conftest import load_lora_into_diffusers, reset_accelerate_state

from .test_qwen_full_scripts import checkpoint_weights, transformer_weights
from .test_scripts import launch_commands, trainer_argv
from .test_wan_scripts import VIDEO, WAN, small

NAMES = [model_id.split("/")[1] for model_id in (*FUN_RELEASES, *FUN_ALIASES)]


@pytest.fixture(scope="module")
def model_root(tmp_path_factory) -> Path:
    return build_tiny_wan_fun_repos(tmp_path_factory.mktemp("fun_scripts_models"))


def control_dataset(folder: Path) -> None:
    """Two clips, each with the other as its control video, a reference image and a camera motion."""
    metadata = build_example_video_dataset(folder, num_videos=2, num_frames=6,
                                           size=(int(VIDEO["--width"]), int(VIDEO["--height"])))
    with metadata.open() as file:
        rows = list(csv.DictReader(file))
    for index, row in enumerate(rows):
        image = f"reference_{index}.png"
        Image.new("RGB", (48, 32), (60 * index, 120, 200)).save(folder / image)
        row.update(control_video=rows[1 - index]["video"], reference_image=image,
                   camera_control_direction=("Left", "RightUp")[index], camera_control_speed="0.05")
    with metadata.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def run_fun_script(relative: str) -> list[dict]:
    """Runs each launch command of a script; the reference's commands leave ``--num_frames`` at its default (81),
    so the small size is added, as ``--height`` and ``--width`` are made small."""
    results = []
    for words in launch_commands((WAN / relative).read_text()):
        _, argv = trainer_argv(words)
        folder = Path(argv[argv.index("--dataset_base_path") + 1])
        if not (folder / "metadata.csv").is_file():
            control_dataset(folder)
        try:
            results.append(trainer.main(WanVideoPipeline, [*small(argv, VIDEO), "--num_frames", "5"], video=True))
        finally:
            reset_accelerate_state()
    for result in results:
        assert result["global_step"] == 2 and all(torch.isfinite(torch.tensor(result["losses"])))
    return results


def test_every_reference_script_is_here_and_names_its_release():
    for kind in ("lora", "full"):
        for name in NAMES:
            (words, *more) = launch_commands((WAN / kind / f"{name}.sh").read_text())
            _, argv = trainer_argv(words)
            assert argv[argv.index("--model_id_with_origin_paths") + 1].startswith(f"PAI/{name}:")
            assert len(more) == (1 if name.startswith("Wan2.2") else 0)


def test_the_fun_1_0_control_lora_loads_whole_into_diffusers_at_its_trained_strength(workdir, model_root):
    from diffusers import WanImageToVideoPipeline
    from peft.utils import get_peft_model_state_dict

    (result,) = run_fun_script("lora/Wan2.1-Fun-1.3B-Control.sh")
    trained = result["module"].pipe
    assert type(trained.dit).__name__ == "WanTransformer3DModel" and trained.dit.config.in_channels == 48
    lora = workdir / "models/train/Wan2.1-Fun-1.3B-Control_lora/epoch-0.safetensors"
    # The script trains in bfloat16: both sides compute in float32 from the same bfloat16 weights.
    released = load_model(ModelConfig(model_id="PAI/Wan2.1-Fun-1.3B-Control",
                                      origin_file_pattern="diffusion_pytorch_model*.safetensors"), torch.bfloat16).float()
    theirs = WanImageToVideoPipeline(tokenizer=trained.tokenizer, text_encoder=trained.text_encoder, vae=trained.vae,
                                     scheduler=None, image_processor=trained.image_processor,
                                     image_encoder=trained.image_encoder, transformer=released)
    inputs = dict(hidden_states=torch.randn(1, 48, 2, 4, 6), timestep=torch.tensor([600.0]),
                  encoder_hidden_states=torch.randn(1, 5, 32), encoder_hidden_states_image=torch.randn(1, 3, 32),
                  return_dict=False)
    with torch.no_grad():
        before = released(**inputs)[0]
        messages = load_lora_into_diffusers(theirs, lora, "fun")
        after, expected = released(**inputs)[0], copy.deepcopy(trained.dit).float().eval()(**inputs)[0]
    assert not messages, messages
    loaded = get_peft_model_state_dict(released, adapter_name="fun")
    layers = {key.rsplit(".lora_", 1)[0] for key in loaded}
    # every layer of the file (10 per block); diffusers adds zero LoRAs on the image projections of an I2V model
    assert set(read_lora(lora).layers) <= layers and len(read_lora(lora).layers) == 20
    assert {layer.rsplit(".", 1)[1] for layer in layers - set(read_lora(lora).layers)} <= {"add_k_proj", "add_v_proj"}
    # diffusers applies the file as the trainer's model ran it, and that is not the released model's output.
    torch.testing.assert_close(after, expected, rtol=1e-4, atol=1e-5)
    assert (after - before).abs().max() > 1e-4


@pytest.mark.parametrize("script", ["lora/Wan2.1-Fun-V1.1-1.3B-Control.sh",
                                    "full/Wan2.1-Fun-V1.1-1.3B-Control-Camera.sh",
                                    "lora/Wan2.2-Fun-A14B-Control-Camera.sh"])
def test_the_fun_scripts_train_on_their_inputs(workdir, model_root, script):
    results = run_fun_script(script)
    pipe = results[0]["module"].pipe
    assert type(pipe.dit).__name__ == "WanFunTransformer3DModel"
    if script.startswith("full/"):  # every weight is written, the camera adapter's trained too
        saved = checkpoint_weights(workdir / "models/train/Wan2.1-Fun-V1.1-1.3B-Control-Camera_full/epoch-0")
        released = convert_wan_transformer_to_diffusers(
            transformer_weights(model_root / "PAI/Wan2.1-Fun-V1.1-1.3B-Control-Camera"))
        assert saved.keys() == released.keys()
        assert not torch.equal(saved["control_adapter.conv.weight"], released["control_adapter.conv.weight"])
