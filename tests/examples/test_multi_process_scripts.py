"""The split-training and low-VRAM scripts as a user with two GPUs runs them: ``accelerate launch`` as written, under
the default config ``accelerate config`` writes for two processes.

Every command of a script is launched with ``accelerate launch`` from a scratch working folder whose
``$HF_HOME/accelerate/default_config.yaml`` says two processes (gloo on this CPU), with only the sizes, epochs and
repeat counts made small and ``DIFFSYNTH_MODEL_BASE_PATH`` pointing at the tiny repos. Stage 2 of these scripts names
``--offload_models``: models it never computes with, built as skeletons on the meta device beside the trained one.
Wan2.1-I2V's split-training script is its low-VRAM one without fp8, so the low-VRAM one stands for both.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from diffsynth.core.data.example_dataset import build_example_dataset, build_example_video_dataset
from diffsynth.training.config.parsers import build_parser

from tests.launching import free_port

from .test_scripts import REPO, launch_commands, trainer_argv

IMAGE_SIZES = {"--num_epochs": "1", "--dataset_repeat": "1", "--max_pixels": "4096", "--height": "32", "--width": "32"}
VIDEO_SIZES = {"--num_epochs": "1", "--dataset_repeat": "1", "--num_frames": "5", "--height": "32", "--width": "48"}
SCRIPTS = {
    "qwen_image/model_training/special/split_training/Qwen-Image-LoRA.sh": IMAGE_SIZES,
    "wanvideo/model_training/special/low_vram_training/Wan2.1-I2V-14B-480P.sh": VIDEO_SIZES,
}


def user_accelerate_config(home: Path) -> Path:
    """What ``accelerate config`` writes for one machine with two GPUs (here two gloo processes on the CPU)."""
    path = home / "accelerate" / "default_config.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump({
        "compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU", "num_machines": 1,
        "num_processes": 2, "machine_rank": 0, "mixed_precision": "no", "use_cpu": False, "gpu_ids": "all",
        "main_training_function": "main", "rdzv_backend": "static", "same_network": True, "debug": False,
    }))  # fmt: skip
    return path


def small(argv: list[str], sizes: dict[str, str]) -> list[str]:
    argv = list(argv)
    for index, word in enumerate(argv[:-1]):
        if word in sizes:
            argv[index + 1] = sizes[word]
    return argv


def draw_dataset(argv: list[str], video: bool) -> None:
    """Draws a two-sample dataset where a raw-data command expects one."""
    args = build_parser(video=video).parse_args(argv)
    if args.task.endswith(":train") or Path(args.dataset_metadata_path).is_file():
        return
    if video:
        build_example_video_dataset(args.dataset_base_path, num_videos=2, num_frames=6, size=(48, 32))
    else:
        build_example_dataset(args.dataset_base_path, num_images=2)


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_the_script_trains_on_two_processes_under_the_users_accelerate_config(script, tmp_path, tiny_root,
                                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "hf_home"
    user_accelerate_config(home)
    env = {**os.environ, "HF_HOME": str(home), "DIFFSYNTH_MODEL_BASE_PATH": str(tiny_root), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    video = script.startswith("wanvideo")
    outputs = []
    for words in launch_commands((REPO / "examples" / script).read_text()):
        train_py, argv = trainer_argv(words)
        assert "--config_file" not in words  # the user's default config decides the process count
        argv = small(argv, SCRIPTS[script])
        draw_dataset(argv, video)
        done = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--main_process_port",
                               str(free_port()), str(train_py), *argv], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        outputs.append(tmp_path / argv[argv.index("--output_path") + 1])
    # Stage 2 trained a LoRA from the cache the two processes of stage 1 wrote.
    assert sorted(p.name for p in outputs[0].iterdir() if p.name.isdigit()) == ["0", "1"]
    trained = load_file(str(outputs[-1] / "epoch-0.safetensors"))
    assert max(value.abs().max().item() for key, value in trained.items() if "lora_B" in key) > 0
