"""The Wan example scripts run as written on tiny original-layout repos, through the trainer's ``main``.

Each ``accelerate launch`` command of a script runs in this process from a scratch working folder, with only what a
user on a small machine would change: the sizes (``--height``, ``--width``, ``--num_frames``), the epochs and the
dataset's repeat count, and ``DIFFSYNTH_MODEL_BASE_PATH`` pointing at the tiny repos. The dataset is drawn at the path
the script names. A LoRA trained on the original layout then loads into diffusers' ``WanPipeline`` built from the
diffusers-layout twin, with no key left over on either side, and changes its output.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from diffsynth.core.data.example_dataset import build_example_video_dataset
from diffsynth.testing.tiny_models import WAN_MODEL_ID
from diffsynth.lora import read_lora
from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
from diffsynth.training import entry as trainer
from diffsynth.training.config.parsers import build_parser
from tests.conftest import reset_accelerate_state

from .test_scripts import REPO, launch_commands, trainer_argv

WAN = REPO / "examples" / "wanvideo" / "model_training"
SMALL = {"--num_epochs": "1", "--dataset_repeat": "1", "--num_frames": "5"}
VIDEO = {"--height": "32", "--width": "48"}
TI2V_VIDEO = {"--height": "64", "--width": "64"}  # multiples of 32, the 16x-compressing VAE's token size


def small(argv: list[str], sizes: dict[str, str]) -> list[str]:
    """``argv`` with the sizes, epochs and repeat count replaced (``--num_frames`` only where the command has it)."""
    changes = {**SMALL, **sizes}
    argv = list(argv)
    for index, word in enumerate(argv[:-1]):
        if word in changes:
            argv[index + 1] = changes[word]
    return argv


def run_script(relative: str, sizes: dict[str, str]) -> list[dict]:
    """Runs every launch command of a script through ``trainer.main``; the working folder is the caller's."""
    results = []
    for words in launch_commands((WAN / relative).read_text()):
        train_py, argv = trainer_argv(words)
        assert train_py == WAN / "train.py", shlex.join(words)
        argv = small(argv, sizes)
        args = build_parser(video=True).parse_args(argv)
        if not args.task.endswith(":train") and not Path(args.dataset_metadata_path).is_file():
            build_example_video_dataset(args.dataset_base_path, num_videos=2, num_frames=6,
                                        size=(int(sizes["--width"]), int(sizes["--height"])))
        try:
            results.append(trainer.main(WanVideoPipeline, argv, video=True))
        finally:
            reset_accelerate_state()
    return results


def lora_keys(path: Path) -> set[str]:
    return set(load_file(str(path)))


def test_wan21_t2v_lora_loads_into_diffusers_wan_pipeline(workdir, tiny_root):
    from diffusers import WanPipeline
    from peft.utils import get_peft_model_state_dict

    (result,) = run_script("lora/Wan2.1-T2V-1.3B.sh", VIDEO)
    assert result["module"].pipe.dit.is_gradient_checkpointing  # forced on for Wan, as the reference does
    lora = workdir / "models/train/Wan2.1-T2V-1.3B_lora/epoch-0.safetensors"
    pipe = WanPipeline.from_pretrained(str(tiny_root / WAN_MODEL_ID), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    kwargs = dict(prompt="a red cat", height=32, width=48, num_frames=5, num_inference_steps=2, output_type="pt",
                  max_sequence_length=16)
    before = pipe(**kwargs, generator=torch.Generator().manual_seed(0)).frames
    assert torch.equal(pipe(**kwargs, generator=torch.Generator().manual_seed(0)).frames, before)
    pipe.load_lora_weights(str(lora))
    (adapter,) = pipe.get_list_adapters()["transformer"]
    loaded = get_peft_model_state_dict(pipe.transformer, adapter_name=adapter)
    # The file names layers the original Wan way; diffusers converts them onto exactly the file's layers.
    assert {key.rsplit(".lora_", 1)[0] for key in loaded} == set(read_lora(lora).layers)
    assert len(loaded) == 2 * 20  # lora_A and lora_B of 20 layers (10 per block, 2 blocks)
    after = pipe(**kwargs, generator=torch.Generator().manual_seed(0)).frames
    # The script sets no --seed, so the trained update's size varies from run to run (0.001 of the frames at the
    # least seen); the same pipeline and generator repeat the frames exactly (above), so any change is the LoRA's.
    assert (after - before).abs().max() > 1e-5


@pytest.mark.parametrize(("name", "boundary", "timestep"), [("Wan2.2-T2V-A14B", 0.417, 875),
                                                            ("Wan2.2-I2V-A14B", 0.358, 900)])
def test_wan22_a14b_trains_each_expert_on_its_timesteps(workdir, name, boundary, timestep):
    high, low = run_script(f"lora/{name}.sh", VIDEO)
    for result, folder in ((high, "high_noise_model"), (low, "low_noise_model")):
        pipe = result["module"].pipe
        assert pipe.dit2 is None and pipe.model_configs["dit"].origin_file_pattern.startswith(folder)
        assert result["global_step"] == 2 and all(torch.isfinite(torch.tensor(result["losses"])))
    # the script's boundary on the training grid is the timestep where the release switches experts
    grid = high["module"].pipe.scheduler.training_timesteps
    assert abs(float(grid[int(boundary * len(grid))]) - timestep) < 1.5
    assert (high["module"].loss.max_timestep_boundary, low["module"].loss.min_timestep_boundary) == (boundary,) * 2
    assert lora_keys(workdir / f"models/train/{name}_high_noise_lora/epoch-0.safetensors") == \
        lora_keys(workdir / f"models/train/{name}_low_noise_lora/epoch-0.safetensors")


def test_wan22_ti2v_trains_from_the_first_frame(workdir):
    (result,) = run_script("lora/Wan2.2-TI2V-5B.sh", TI2V_VIDEO)
    assert result["module"].pipe.vae.config.z_dim == 48 and result["global_step"] == 2
    assert all(torch.isfinite(torch.tensor(result["losses"])))
    assert (workdir / "models/train/Wan2.2-TI2V-5B_lora/epoch-0.safetensors").is_file()


def test_wan21_i2v_trains_from_the_first_frame_with_clip_features(workdir):
    (result,) = run_script("lora/Wan2.1-I2V-14B-480P.sh", VIDEO)
    pipe = result["module"].pipe
    assert type(pipe.image_encoder).__name__ == "CLIPVisionModel" and pipe.image_processor is not None
    assert result["global_step"] == 2 and all(torch.isfinite(torch.tensor(result["losses"])))
    assert (workdir / "models/train/Wan2.1-I2V-14B-480P_lora/epoch-0.safetensors").is_file()


@pytest.mark.parametrize("script", ["special/split_training/Wan2.1-I2V-14B-480P.sh",
                                    "special/split_training/Wan2.1-T2V-1.3B-LoRA.sh",
                                    "special/low_vram_training/Wan2.1-I2V-14B-480P.sh"])
def test_wan21_two_stage_scripts_run(workdir, script):
    cached, trained = run_script(script, VIDEO)
    assert cached["cached"] == 2
    assert trained["global_step"] == 2 and all(torch.isfinite(torch.tensor(trained["losses"])))
    pipe = trained["module"].pipe
    assert pipe.text_encoder is not None and all(p.is_meta for p in pipe.text_encoder.parameters())
