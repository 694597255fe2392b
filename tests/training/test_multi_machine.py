"""A run over two machines, simulated on this host: two ``accelerate launch --num_machines 2 --machine_rank 0|1
--main_process_ip 127.0.0.1 --main_process_port P`` commands of one process each (gloo on the CPU), through the
``diffsynth-launch`` entry, on the tiny Qwen-Image.

Each scenario is launched once per module (launches of one phase run at once) and compared with the same run on
one machine with two processes: the LoRA (or full weights) bit for bit, the metrics row for row. Unless a test says
otherwise each machine has a folder of its own (local disks): machine 1's ``--output_path`` stays empty, as only the
main process writes, and a resume there gets the checkpoint from the main process.

Every process start costs seconds of imports, so launches are shared: the LoRA runs serve both the equality and the
resume claims, stage 2 of the split run is the full fine-tune, and only the user's commands that a claim is about
(the two-machine LoRA run and the killed run) go through ``diffsynth-launch``; the others start the
training processes directly with the rendezvous variables torchrun would give them (``direct_process_env``), which
spares a launcher process per machine.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.launching import accelerate_launch, direct_process_env, free_port
from tests.training.conftest import lora
from tests.training.test_trainer import ALL_MODELS, COMMON, PATTERN, REPO, TRAIN_PY, raw

LORA = [*COMMON, "--dataset_repeat", "2", "--save_steps", "3", "--enable_csv_log"]
LOST_LINE = "[rank 0 (machine 0, host "


class Launch:
    """One simulated machine's ``diffsynth-launch``, or one training process started directly, started at once."""

    def __init__(self, command: list[str], tiny_root: Path, extra_env: dict[str, str] | None = None):
        env = {**os.environ, "DIFFSYNTH_MODEL_BASE_PATH": str(tiny_root), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), **(extra_env or {})}
        env.pop("DIFFSYNTH_DEBUG", None)
        # A session of its own: a launch left behind by a failed test is killed whole.
        self.process = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, start_new_session=True)
        self.code: int | None = None
        self.output = ""

    def wait(self, timeout: float = 300) -> Launch:
        try:
            stdout, stderr = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            raise
        self.code, self.output = self.process.returncode, stdout + stderr
        return self


def launched(flags: list[str], tiny_root: Path, *, machines: int, rank: int = 0, port: int | None = None) -> Launch:
    """Machine ``rank``'s ``diffsynth-launch`` of two processes in all, as a user starts it."""
    return Launch([*accelerate_launch(2, num_machines=machines, machine_rank=rank, port=port,
                                      launcher="diffsynth.training.launch"), str(TRAIN_PY), *flags], tiny_root)


def two_machines(tiny_root: Path, flags: list[str], outputs: tuple[Path, Path], *, launcher: bool = False,
                 **per_machine) -> list[Launch]:
    """Machines 0 and 1 of one run, each with its ``--output_path`` (and ``per_machine[f"extra{rank}"]`` flags),
    through ``diffsynth-launch`` if ``launcher``, else each machine's one process started directly."""
    port = free_port()
    machines = []
    for rank, output in enumerate(outputs):
        argv = [*flags, "--output_path", str(output), *per_machine.get(f"extra{rank}", [])]
        machines.append(launched(argv, tiny_root, machines=2, rank=rank, port=port) if launcher else
                        Launch([sys.executable, str(TRAIN_PY), *argv], tiny_root, direct_process_env(
                            rank, 2, local_rank=0, local_world_size=1, machine=rank, port=port)))
    return machines


def one_machine(tiny_root: Path, flags: list[str], output: Path) -> list[Launch]:
    """The run on one machine with two processes, started directly."""
    port = free_port()
    return [Launch([sys.executable, str(TRAIN_PY), *flags, "--output_path", str(output)], tiny_root,
                   direct_process_env(rank, 2, local_rank=rank, local_world_size=2, machine=0, port=port))
            for rank in range(2)]


def finish(*launches: Launch) -> list[Launch]:
    done = [launch.wait() for launch in launches]
    for launch in done:
        assert launch.code == 0, launch.output[-3000:]
    return done


def metrics(output: Path) -> list[dict[str, str]]:
    with open(output / "logs" / "metrics.csv", newline="") as handle:
        return [{key: row[key] for key in ("step", "loss", "lr")} for row in csv.DictReader(handle)]


def assert_equal(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> None:
    assert first.keys() == second.keys() and all(torch.equal(first[key], second[key]) for key in first)


@pytest.fixture(scope="module")
def lora_runs(dataset, tmp_path_factory, tiny_root):
    """Phase 1: one epoch on two machines and on one machine. Phase 2: each continued to two epochs with
    ``--resume_from_checkpoint latest`` on the other machine count: the two-machine run on one machine, the
    one-machine run on two (machine 0 in its folder, machine 1 in an empty folder of its own)."""
    root = tmp_path_factory.mktemp("lora")
    flags = [*raw(dataset), *LORA]
    two = two_machines(tiny_root, [*flags, "--num_epochs", "1"], (root / "two0", root / "two1"), launcher=True)
    one = one_machine(tiny_root, [*flags, "--num_epochs", "1"], root / "one")
    finish(*two, *one)
    records = os.listdir(root / "two0" / ".diffsynth" / "written")  # before the resume adds its own
    resume = [*flags, "--num_epochs", "2", "--resume_from_checkpoint", "latest"]
    back = one_machine(tiny_root, resume, root / "two0")
    forth = two_machines(tiny_root, resume, (root / "one", root / "forth1"))
    finish(*back, *forth)
    return root, two, forth, records


def test_two_machines_train_the_lora_of_one_machine_bit_for_bit(lora_runs):
    root, two, _, records = lora_runs
    assert_equal(lora(root / "two0", "epoch-0"), lora(root / "one", "epoch-0"))
    assert metrics(root / "two0")[:3] == metrics(root / "one")[:3]
    # Only the main process wrote, once: machine 1's folder was never made, one process recorded files.
    assert not (root / "two1").exists() and len(records) == 1
    assert two[0].output.count("LoRA / weights written to") == 1 and "LoRA / weights" not in two[1].output


def test_a_two_machine_checkpoint_resumes_on_one_machine_and_back_bit_for_bit(lora_runs):
    """Two machines then one, and one then two, continue alike: the same LoRA after the second epoch, the same
    metrics over both (a resume on one process continuing its run bit for bit: tests/training/test_trainer.py)."""
    root, _, forth, _ = lora_runs
    assert_equal(lora(root / "two0", "epoch-1"), lora(root / "one", "epoch-1"))
    assert metrics(root / "two0") == metrics(root / "one") and len(metrics(root / "one")) == 6
    assert not torch.equal(*(lora(root / "one", name)["diffusion_model.transformer_blocks.0.attn.to_q.lora_B.weight"]
                             for name in ("epoch-0", "epoch-1")))  # the second epoch trained
    # Machine 1 of the second run has a disk of its own: the main process sent it the checkpoint.
    assert "resuming from the main process's" in forth[1].output and not (root / "forth1").exists()


def test_split_training_across_two_machines_with_a_full_fine_tune_in_stage_two(dataset, tmp_path, tiny_root):
    """Stage 1 across two machines into one shared folder, each process its share of the samples; then stage 2 on
    two machines with separate disks (each reading the whole cache) training every weight of the transformer: the
    weights of one machine with two processes, bit for bit, written once by the main process. A stage 1 whose
    machines have separate disks is refused before any work, naming what must be shared."""
    stage_one = [*raw(dataset), *COMMON, "--task", "sft:data_process", "--offload_models", PATTERN["dit"]]
    shared = two_machines(tiny_root, stage_one, (tmp_path / "cache", tmp_path / "cache"))
    separate = two_machines(tiny_root, stage_one, (tmp_path / "separate0", tmp_path / "separate1"))
    finish(*shared)
    for launch in separate:
        launch.wait()
        assert launch.code == 2 and "process(es) 1 do not see the main process's --output_path" in launch.output
        assert "loaded " not in launch.output, launch.output[-3000:]
    assert not (tmp_path / "separate1").exists()
    # Three samples: process 0 cached samples 0 and 2, process 1 sample 1.
    assert sorted(path.relative_to(tmp_path / "cache").as_posix()
                  for path in (tmp_path / "cache").glob("[0-9]*/*.safetensors")) == [
        "0/0.safetensors", "0/2.safetensors", "1/1.safetensors"]
    stage_two = ["--dataset_base_path", str(tmp_path / "cache"), "--model_id_with_origin_paths", ALL_MODELS,
                 "--trainable_models", "dit", "--torch_dtype", "float32", "--seed", "3", "--max_pixels", "4096",
                 "--learning_rate", "1e-3", "--task", "sft:train", "--offload_models",
                 f"{PATTERN['text_encoder']},{PATTERN['vae']}", "--dataset_repeat", "2", "--num_epochs", "1",
                 "--find_unused_parameters"]
    finish(*two_machines(tiny_root, stage_two, (tmp_path / "train0", tmp_path / "train1")),
           *one_machine(tiny_root, stage_two, tmp_path / "train_one"))
    written = sorted(path.relative_to(tmp_path / "train_one")
                     for path in (tmp_path / "train_one").rglob("epoch-0*.safetensors"))
    assert written and not (tmp_path / "train1").exists()
    for path in written:
        assert_equal(load_file(str(tmp_path / "train0" / path)), load_file(str(tmp_path / "train_one" / path)))
    # Every weight file of the transformer is the one trained: it left the release's weights.
    trained = load_file(str(tmp_path / "train0" / "epoch-0.safetensors"))
    release = {}
    for shard in (tiny_root / PATTERN["dit"].split(":")[0]).glob("transformer/*.safetensors"):
        release.update(load_file(str(shard)))
    assert trained.keys() == release.keys()
    assert max((trained[key] - release[key]).abs().max().item() for key in trained) > 1e-4


def worker_of(launch: Launch) -> int:
    """The pid of the training process a machine's launcher started (its only child)."""
    children = Path(f"/proc/{launch.process.pid}/task/{launch.process.pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def test_a_killed_process_stops_the_other_machine_with_one_line_naming_it(dataset, tmp_path, tiny_root):
    """``kill -9`` of machine 1's process: machine 0 stops within seconds, non-zero, with one line naming the lost
    process and no traceback; the same training command with ``--resume_from_checkpoint latest`` continues."""
    flags = [*raw(dataset), *LORA, "--dataset_repeat", "200", "--save_steps", "1"]
    machines = two_machines(tiny_root, flags, (tmp_path / "out0", tmp_path / "out1"), launcher=True)
    deadline = time.monotonic() + 240
    # Any checkpoint: on a quiet machine step-1 may already have given way to a later one between two looks.
    while not any((tmp_path / "out0" / "checkpoints").glob("step-*")):
        assert time.monotonic() < deadline and machines[0].process.poll() is None
        time.sleep(0.5)
    os.kill(worker_of(machines[1]), signal.SIGKILL)
    killed = time.monotonic()
    survivor = machines[0].wait(timeout=180)
    assert time.monotonic() - killed < 120 and survivor.code != 0
    [line] = [line for line in survivor.output.splitlines() if line.startswith(LOST_LINE)]
    assert "lost rank 1 (machine 1, host" in line and "--resume_from_checkpoint latest" in line
    assert "Traceback" not in survivor.output and "ChildFailedError" not in survivor.output
    assert machines[1].wait(timeout=60).code == 128 + signal.SIGKILL
    # The restart resumes from the last checkpoint (and stops one step later).
    last = max(int(path.name.split("-")[1]) for path in (tmp_path / "out0" / "checkpoints").glob("step-*"))
    restart = finish(*two_machines(tiny_root, [*flags, "--resume_from_checkpoint", "latest", "--max_train_steps",
                                               str(last + 1)], (tmp_path / "out0", tmp_path / "out1")))
    assert f"resuming from {tmp_path / 'out0' / 'checkpoints' / f'step-{last}'} (optimizer step {last})" in \
        restart[0].output
