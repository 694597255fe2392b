"""The trainer under accelerate + DeepSpeed ZeRO-3 on the CPU (one process: what accelerate supports without GPUs).

Two or more processes under DeepSpeed need GPUs (accelerate's CPU state then disagrees with DeepSpeed's world size);
that run is marked ``gpu``.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from diffsynth.core.data.example_dataset import build_example_dataset
from tests.training.test_trainer import COMMON, PATTERN, raw

pytest.importorskip("deepspeed")

REPO = Path(__file__).resolve().parents[2]
TRAIN_PY = REPO / "examples" / "qwen_image" / "model_training" / "train.py"


def write_configs(folder: Path, num_processes: int = 1, use_cpu: bool = True,
                  accelerate_yaml: Path = REPO / "configs" / "accelerate_deepspeed_zero3_cpu_offload.yaml") -> Path:
    """A ZeRO-3 recipe of the repository (``accelerate_yaml`` and the DeepSpeed JSON it names), adapted to this
    machine: no pinned memory, every parameter partitioned, and the torch optimizer (DeepSpeed's CPU Adam needs a JIT
    build and moves a zero gradient by a full step)."""
    import yaml

    accelerate_config = yaml.safe_load(accelerate_yaml.read_text())
    config = json.loads((REPO / accelerate_config["deepspeed_config"]["deepspeed_config_file"]).read_text())
    zero = config["zero_optimization"]
    zero["offload_param"]["pin_memory"] = False
    zero["offload_optimizer"] = {"device": "none"}
    zero["stage3_param_persistence_threshold"] = 0
    config["zero_force_ds_cpu_optimizer"] = False
    (folder / "ds.json").write_text(json.dumps(config))
    accelerate_config["deepspeed_config"]["deepspeed_config_file"] = str(folder / "ds.json")
    accelerate_config.update(num_processes=num_processes, use_cpu=use_cpu)
    (folder / "accelerate.yaml").write_text(yaml.safe_dump(accelerate_config))
    return folder / "accelerate.yaml"


def launch(config: Path, argv: list[str], tiny_root: Path, cwd: Path = REPO) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), str(TRAIN_PY), *argv]
    env = {**os.environ, "DIFFSYNTH_MODEL_BASE_PATH": str(tiny_root), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=cwd)


@pytest.fixture(scope="module")
def two_stage_runs(tmp_path_factory, tiny_root):
    """Stage 1 and stage 2 under the DeepSpeed config, and stage 2 without it, from the same cache."""
    folder = tmp_path_factory.mktemp("deepspeed")
    build_example_dataset(folder / "data", num_images=2)
    config = write_configs(folder)
    stage_one = launch(config, [*raw(folder / "data"), *COMMON, "--task", "sft:data_process", "--output_path",
                                str(folder / "cache"), "--offload_models", PATTERN["dit"]], tiny_root)
    stage_two = ["--dataset_base_path", str(folder / "cache"), *COMMON, "--task", "sft:train", "--num_epochs", "2",
                 "--offload_models", f"{PATTERN['text_encoder']},{PATTERN['vae']}", "--initialize_model_on_cpu"]
    zero3 = launch(config, [*stage_two, "--output_path", str(folder / "zero3")], tiny_root)
    plain = subprocess.run([sys.executable, str(TRAIN_PY), *stage_two, "--output_path", str(folder / "plain")],
                           env={**os.environ, "DIFFSYNTH_MODEL_BASE_PATH": str(tiny_root)}, capture_output=True,
                           text=True, timeout=600, cwd=REPO)
    return folder, stage_one, zero3, plain


def test_stage_one_runs_under_a_deepspeed_config(two_stage_runs):
    folder, stage_one, _, _ = two_stage_runs
    assert stage_one.returncode == 0, stage_one.stderr[-3000:]
    assert sorted(p.name for p in (folder / "cache" / "0").iterdir()) == ["0.safetensors", "1.safetensors"]


def test_zero3_training_gives_the_plain_lora(two_stage_runs):
    folder, _, zero3, plain = two_stage_runs
    assert zero3.returncode == 0, zero3.stderr[-3000:]
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert "released models this stage never runs" in zero3.stderr
    sharded, reference = (load_file(str(folder / run / "epoch-1.safetensors")) for run in ("zero3", "plain"))
    assert sharded.keys() == reference.keys()
    assert max((sharded[k] - reference[k]).abs().max().item() for k in sharded) < 1e-6
    assert max(sharded[k].abs().max().item() for k in sharded if "lora_B" in k) > 1e-5
    # No training-state checkpoint: ZeRO partitions the optimizer state, so resuming is refused instead.
    assert not (folder / "zero3" / "checkpoints").exists()


def test_offload_and_resume_are_refused_under_deepspeed(two_stage_runs, tiny_root):
    folder, *_ = two_stage_runs
    config = write_configs(folder)
    done = launch(config, ["--dataset_base_path", str(folder / "cache"), *COMMON, "--task", "sft:train",
                           "--output_path", str(folder / "refused"), "--enable_model_cpu_offload",
                           "--resume_from_checkpoint", "latest", "--ema_decay", "0.99"], tiny_root)
    assert done.returncode != 0
    assert "--enable_model_cpu_offload and DeepSpeed both decide where the weights live" in done.stderr
    assert "continue from a LoRA file with --lora_checkpoint" in done.stderr
    assert "--ema_decay 0.99 cannot run under DeepSpeed" in done.stderr
    assert not (folder / "refused").exists()  # refused before the output folder is claimed, let alone a model


@pytest.mark.gpu
def test_two_gpus_under_zero3_train_identical_weights(tmp_path, tiny_root):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    build_example_dataset(tmp_path / "data", num_images=4)
    config = write_configs(tmp_path, num_processes=2, use_cpu=False)
    done = launch(config, [*raw(tmp_path / "data"), *COMMON, "--output_path", str(tmp_path / "out")], tiny_root)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "out" / "epoch-1.safetensors").is_file()


def test_a_non_finite_loss_stops_zero3_training_before_its_update(two_stage_runs, tiny_root):
    from diffsynth.core.finite import nonfinite_names
    from tests.training.loop.test_nonfinite_guard import poison, saved_tensors

    folder, *_ = two_stage_runs
    cache = folder / "poisoned_cache"
    shutil.copytree(folder / "cache", cache)
    poison(cache / "0" / "1.safetensors")
    done = launch(write_configs(folder), [
        "--dataset_base_path", str(cache), *COMMON, "--task", "sft:train", "--num_epochs", "2", "--offload_models",
        f"{PATTERN['text_encoder']},{PATTERN['vae']}", "--initialize_model_on_cpu", "--output_path",
        str(folder / "poisoned"),
    ], tiny_root)  # fmt: skip
    # The launcher (torch elastic, even for one process) exits with 1 and reports the process's own code.
    assert done.returncode == 1 and re.search(r"exitcode\s*: 3 ", done.stderr), done.stderr[-3000:]
    assert "DeepSpeed applies each update inside backward" in done.stderr
    assert f"cache file {cache / '0' / '1.safetensors'}" in done.stderr
    assert not any(nonfinite_names(tensors) for tensors in saved_tensors(folder / "poisoned").values())
