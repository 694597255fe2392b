"""Preemption: SIGTERM / SIGINT stop a stage cleanly (checkpoint, exit code 75) and a resumed run ends where an
uninterrupted one does; timed checkpoints; the exit codes."""

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from diffsynth.core.data import CacheError, DatasetError
from diffsynth.core.disk_full import DiskFullError
from diffsynth.core.finite import NonFiniteTensorError, nonfinite_names
from diffsynth.core.loader import ModelLoadError
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.training import cli, exit_codes, main
from diffsynth.training.config.errors import FlagError
from diffsynth.training.loop.nonfinite_guard import TrainingDivergedError
from diffsynth.training.loop.preemption import CheckpointClock, PreemptionListener, RunPreempted
from diffsynth.training.outputs.checkpoint import read_progress, resolve_checkpoint
from tests.training.loop.test_nonfinite_guard import poison
from tests.training.test_trainer import COMMON, TRAIN_PY, lora, max_difference, raw, stage_two_argv
from tests.launching import accelerate_launch


@pytest.fixture(autouse=True)
def in_process_runs(base, fresh_accelerate_state):
    """Every test here runs the trainer in-process on the tiny repos."""


@pytest.fixture
def pythons_ctrl_c():
    """Python's own SIGINT handler, as in a terminal: a test run earlier in the same worker process (a launcher, a
    library) may have left another one, and the second Ctrl-C hands the signal to whatever was there before."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.mark.usefixtures("pythons_ctrl_c")
def test_the_first_signal_asks_and_a_second_ctrl_c_aborts_at_once():
    before = signal.getsignal(signal.SIGINT)
    with PreemptionListener() as listener:
        os.kill(os.getpid(), signal.SIGINT)
        assert listener.requested and listener.received == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.usefixtures("pythons_ctrl_c")
def test_a_repeated_sigterm_only_repeats_the_request_and_ctrl_c_then_aborts(caplog):
    heard = []

    def scheduler_handler(signum, frame):
        heard.append(signum)

    before = signal.signal(signal.SIGTERM, scheduler_handler)
    try:
        with caplog.at_level(logging.WARNING), PreemptionListener() as listener:
            # The scheduler's signal, and the same one forwarded by a launcher.
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
            assert listener.received == signal.SIGTERM and heard == []
            assert "received SIGTERM again: already stopping" in caplog.text
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGTERM) is scheduler_handler
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_checkpoint_clock():
    now = [0.0]
    clock = CheckpointClock(2, clock=lambda: now[0])
    now[0] = 119.0
    assert not clock.due()
    now[0] = 120.0
    assert clock.due()
    clock.reset()
    assert not clock.due()
    assert not CheckpointClock(0, clock=lambda: 1e9).due()
    with pytest.raises(ValueError, match="--checkpoint_every_minutes nan must be at least 0"):
        CheckpointClock(float("nan"))


@pytest.mark.parametrize("error, code", [
    (RunPreempted("stopped", 3), 75), (TrainingDivergedError("diverged", 3), 3),
    (NonFiniteTensorError("nan", ["a"]), 3), (FlagError(["--x"]), 2), (DatasetError("row"), 2),
    (CacheError("cache"), 2), (ModelLoadError("truncated shard"), 2), (DiskFullError("full", Path("f"), 9, 1), 74),
    (ValueError("bug"), 1), (RuntimeError("out of memory"), 1), (KeyboardInterrupt(), 130),
])  # fmt: skip
def test_each_outcome_has_its_exit_code(error, code, capsys):
    def fail():
        raise error

    assert exit_codes.run_with_exit_code(fail) == code
    assert exit_codes.run_with_exit_code(lambda: None) == exit_codes.SUCCESS
    with pytest.raises(SystemExit):  # argparse's own exit passes through
        exit_codes.run_with_exit_code(sys.exit, 2)


def test_stage_one_stops_after_the_sample_in_progress_and_a_rerun_completes_it(dataset, tmp_path, monkeypatch,
                                                                                  caplog):
    from diffsynth.training.loop import stage_one as caching

    save = caching.save_cache_sample

    def save_then_signal(*args, **kwargs):
        path = save(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # the scheduler's signal, arriving while a sample is being cached
        return path

    monkeypatch.setattr(caching, "save_cache_sample", save_then_signal)
    def stage_one(output):
        return [*raw(dataset), *COMMON, "--output_path", str(output), "--task", "sft:data_process"]

    argv = stage_one(tmp_path / "cache")
    with caplog.at_level(logging.WARNING), pytest.raises(SystemExit) as exit_info:
        cli(QwenImagePipeline, argv)
    assert exit_info.value.code == exit_codes.PREEMPTED
    assert "stage 1 stopped by SIGTERM after 1 of the 3 samples process 0 had to compute" in caplog.text
    assert sorted(path.name for path in (tmp_path / "cache" / "0").iterdir()) == ["0.safetensors"]
    monkeypatch.setattr(caching, "save_cache_sample", save)
    assert main(QwenImagePipeline, argv)["cached"] == 2
    main(QwenImagePipeline, stage_one(tmp_path / "fresh"))
    for name in ("0", "1", "2"):
        resumed, fresh = (load_file(str(tmp_path / run / "0" / f"{name}.safetensors")) for run in ("cache", "fresh"))
        assert max_difference(resumed, fresh) == 0


def test_sigterm_saves_a_checkpoint_and_the_resumed_run_ends_where_an_uninterrupted_one_does(dataset, tmp_path,
                                                                                            tiny_root):
    flags = [*raw(dataset), *COMMON, "--dataset_repeat", "4", "--num_epochs", "1", "--enable_csv_log"]
    output, metrics = tmp_path / "out", tmp_path / "out" / "logs" / "metrics.csv"
    env = {**os.environ, "DIFFSYNTH_MODEL_BASE_PATH": str(tiny_root), "OMP_NUM_THREADS": "1"}
    # A loader worker, and the signal sent to the whole process group, as a scheduler or Ctrl-C does.
    with open(tmp_path / "stderr.txt", "w") as stderr:
        process = subprocess.Popen([sys.executable, str(TRAIN_PY), *flags, "--output_path", str(output),
                                    "--dataset_num_workers", "1"], env=env, stdout=subprocess.DEVNULL, stderr=stderr,
                                   start_new_session=True)
        deadline = time.monotonic() + 120
        while process.poll() is None and time.monotonic() < deadline:
            if metrics.is_file() and len(metrics.read_text().splitlines()) > 1:  # a header and a first step
                os.killpg(process.pid, signal.SIGTERM)
                break
            time.sleep(0.005)
        process.wait(timeout=120)
    log = (tmp_path / "stderr.txt").read_text()
    assert process.returncode == exit_codes.PREEMPTED, log[-3000:]
    stopped = int(metrics.read_text().splitlines()[-1].split(",")[0])
    assert 1 <= stopped < 12 and "training stopped by SIGTERM after optimizer step" in log
    assert resolve_checkpoint("latest", output) == output / "checkpoints" / f"step-{stopped}"
    resumed = main(QwenImagePipeline, [*flags, "--output_path", str(output), "--resume_from_checkpoint", "latest"])
    assert resumed["global_step"] == 12 and len(resumed["losses"]) == 12 - stopped
    main(QwenImagePipeline, [*flags, "--output_path", str(tmp_path / "uninterrupted")])
    assert max_difference(lora(output, "epoch-0"), lora(tmp_path / "uninterrupted", "epoch-0")) < 1e-6


def test_timed_checkpoints_are_training_state_only(dataset, tmp_path):
    output = tmp_path / "out"
    main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(output), "--num_epochs", "1",
                             "--checkpoint_every_minutes", "1e-9", "--checkpoints_total_limit", "10"])
    assert sorted(path.name for path in (output / "checkpoints").iterdir()) == ["step-1", "step-2", "step-3"]
    assert sorted(path.name for path in output.glob("*.safetensors")) == ["epoch-0.safetensors"]
    main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(tmp_path / "off"), "--num_epochs", "1",
                             "--checkpoint_every_minutes", "0", "--checkpoints_total_limit", "10"])
    assert [path.name for path in (tmp_path / "off" / "checkpoints").iterdir()] == ["step-3"]  # the epoch's end


RANK_SCRIPT = """
import json, os, signal, sys, torch
from safetensors.torch import save_file
from diffsynth.training import cli, entry as trainer
from diffsynth.training.loop import runner
from diffsynth.training.outputs import logger
from diffsynth.training.loop.preemption import RunPreempted
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline

output = sys.argv[sys.argv.index("--output_path") + 1]
on_step_end, launch = logger.ModelLogger.on_step_end, runner.launch_training_task

def signal_rank_one(self, step, *args, **kwargs):
    if step == 2 and torch.distributed.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGTERM)  # the scheduler's signal reaches this process only
    return on_step_end(self, step, *args, **kwargs)

def record(accelerator, dataset, module, *args, **kwargs):
    try:
        return launch(accelerator, dataset, module, *args, **kwargs)
    except RunPreempted as error:
        rank = torch.distributed.get_rank()
        save_file(module.trainable_state_dict(), f"{output}/rank{rank}.safetensors")
        with open(f"{output}/rank{rank}.json", "w") as handle:
            json.dump({"step": error.step}, handle)
        raise

logger.ModelLogger.on_step_end, trainer.launch_training_task = signal_rank_one, record
cli(QwenImagePipeline, sys.argv[1:])
"""


def test_two_processes_skip_the_same_steps_and_stop_at_the_same_step(dataset, tmp_path, tiny_root):
    cache = tmp_path / "cache"
    main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(cache), "--task", "sft:data_process"])
    poison(cache / "0" / "1.safetensors")
    script = tmp_path / "run.py"
    script.write_text(RANK_SCRIPT)
    output = tmp_path / "two"
    command = [*accelerate_launch(2), str(script),
               *stage_two_argv(cache, output, "--dataset_repeat", "2", "--num_epochs", "2")]
    env = {**os.environ, "DIFFSYNTH_MODEL_BASE_PATH": str(tiny_root), "OMP_NUM_THREADS": "1"}
    # In a session of its own, so that a run that hangs (ranks disagreeing) leaves no process behind.
    launcher = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    try:
        _, stderr = launcher.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        raise
    assert launcher.returncode == 1 and "exitcode  : 75" in stderr, stderr[-3000:]
    steps = [json.loads((output / f"rank{rank}.json").read_text())["step"] for rank in (0, 1)]
    # Rank 1 heard the signal after step 2; both agreed on it in step 3's all-reduce and stopped after step 3.
    assert steps == [3, 3]
    first, second = (load_file(str(output / f"rank{rank}.safetensors")) for rank in (0, 1))
    assert max_difference(first, second) == 0 and not nonfinite_names(first)
    progress = read_progress(resolve_checkpoint("latest", output))
    # Epoch 0's three steps hold all six samples, so both copies of the damaged one: one or two skipped steps.
    assert progress["global_step"] == 3 and progress["nonfinite_steps"] in (1, 2)


def test_a_signal_during_a_save_stops_the_run_after_that_save(dataset, tmp_path, monkeypatch, caplog):
    """SIGTERM while step 1's checkpoint is being written: the run stops there, without training step 2 and saving
    again (a scheduler's grace period may not leave time for a second save)."""
    from diffsynth.training.loop import training_loop

    save, saved_steps = training_loop.save_training_state, []

    def signal_while_saving(output_path, trainable, optimizer_state, scheduler_state, progress, *args, **kwargs):
        saved_steps.append(progress["global_step"])
        if progress["global_step"] == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # the scheduler's signal, arriving mid-save
        return save(output_path, trainable, optimizer_state, scheduler_state, progress, *args, **kwargs)

    monkeypatch.setattr(training_loop, "save_training_state", signal_while_saving)
    output = tmp_path / "out"
    with caplog.at_level(logging.WARNING), pytest.raises(SystemExit) as exit_info:
        cli(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(output), "--num_epochs", "1",
                                "--save_steps", "1", "--enable_csv_log"])
    assert exit_info.value.code == exit_codes.PREEMPTED
    assert "training stopped by SIGTERM after optimizer step 1" in caplog.text
    assert saved_steps == [1]  # one save: the one in progress
    assert sorted(path.name for path in output.glob("*.safetensors")) == ["step-1.safetensors"]
    assert [path.name for path in (output / "checkpoints").iterdir()] == ["step-1"]
    rows = (output / "logs" / "metrics.csv").read_text().splitlines()
    assert rows[-1].split(",")[0] == "1"  # no step trained after it
