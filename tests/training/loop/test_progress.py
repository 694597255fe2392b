"""Progress that fits where it goes: a bar on a terminal, short timed lines in a log file."""

import io
import os
import re
import subprocess
import sys

import pytest
import torch

from diffsynth.training.loop.progress import ProgressReport, format_duration
from tests.training.test_trainer import COMMON, TRAIN_PY, raw

LINE = re.compile(r"^training: (\d+)% (\d+)/(\d+) steps, epoch (\d+)/(\d+), loss [0-9.]+, [0-9.]+ s/step, "
                  r"[0-9.]+ samples/s, elapsed \d+:\d\d:\d\d, ETA \d+:\d\d:\d\d$")


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Terminal(io.StringIO):
    def isatty(self):
        return True


def report(stream, clock, total=20, interval=10.0, **options):
    return ProgressReport(total, "training", interval_seconds=interval, num_epochs=2, samples_per_unit=4,
                          stream=stream, clock=clock, **options)


def test_a_log_gets_a_line_at_the_first_step_then_one_per_interval_and_one_at_the_end():
    stream, clock = io.StringIO(), Clock()
    progress = report(stream, clock)
    written_at = []
    for step in range(20):
        clock.now += 3.0  # 3 s per step, a 10 s interval: lines after steps 1, 5, 9, 13, 17, then the end
        before = stream.getvalue().count("\n")
        progress.update(loss=float(step), epoch=step // 10)
        if stream.getvalue().count("\n") > before:
            written_at.append(step + 1)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert written_at == [1, 5, 9, 13, 17]
    assert len(lines) == 6 and all(LINE.match(line) for line in lines), lines
    # Each line averages the steps since the previous one: steps 18, 19, 20 had losses 17, 18, 19.
    assert lines[-1] == ("training: 100% 20/20 steps, epoch 2/2, loss 18.0000, 3.00 s/step, 1.33 samples/s, "
                         "elapsed 0:01:00, ETA 0:00:00")
    assert "1/20 steps, epoch 1/2, loss 0.0000, 3.00 s/step" in lines[0] and "ETA 0:00:57" in lines[0]


@pytest.mark.parametrize("step_seconds", [0.5, 4.0, 25.0])
def test_no_gap_between_lines_exceeds_the_interval_plus_one_step(step_seconds):
    stream, clock = io.StringIO(), Clock()
    progress = report(stream, clock, total=200)
    times = []
    for _ in range(200):
        clock.now += step_seconds
        before = stream.getvalue().count("\n")
        progress.update(loss=0.5)
        if stream.getvalue().count("\n") > before:
            times.append(clock.now)
    gaps = [later - earlier for earlier, later in zip(times, times[1:])]
    assert max(gaps) <= 10.0 + step_seconds
    assert len(times) >= 200 * step_seconds // (10.0 + step_seconds)


def test_interval_zero_writes_a_line_per_step_and_a_resumed_run_counts_from_its_step():
    stream, clock = io.StringIO(), Clock()
    progress = report(stream, clock, total=10, interval=0, initial=7)
    for _ in range(3):
        clock.now += 1.0
        progress.update(loss=0.25, epoch=1)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == ["training: 80% 8/10 steps", "training: 90% 9/10 steps",
                                                      "training: 100% 10/10 steps"]


def test_non_finite_losses_are_left_out_of_the_average_and_counted():
    stream, clock = io.StringIO(), Clock()
    progress = report(stream, clock, interval=100.0)
    progress.update(loss=1.0)
    for loss in (float("nan"), 2.0, float("inf")):
        progress.update(loss=loss)
    progress.close()
    assert "loss 2.0000 (2 non-finite left out)" in stream.getvalue().splitlines()[-1]


def test_a_terminal_gets_the_bar_and_other_processes_write_nothing():
    terminal, clock = Terminal(), Clock()
    progress = report(terminal, clock)
    assert progress.draws_a_bar
    progress.update(loss=0.5)
    progress.close()
    assert "\r" in terminal.getvalue() and "loss=0.5000" in terminal.getvalue()
    silent = report(io.StringIO(), clock, enabled=False)
    silent.update(loss=0.5)
    silent.close()
    assert silent.stream.getvalue() == ""


def test_peak_memory_is_shown_only_for_a_device_that_keeps_statistics():
    assert "peak" not in report(io.StringIO(), Clock(), device=torch.device("cpu")).line(101.0)
    if torch.cuda.is_available():
        assert "GiB on cuda" in report(io.StringIO(), Clock(), device=torch.device("cuda")).line(101.0)


def test_a_negative_interval_is_refused():
    with pytest.raises(ValueError, match="--progress_interval_seconds -1 must be at least 0"):
        report(io.StringIO(), Clock(), interval=-1)


def test_durations():
    assert [format_duration(s) for s in (0, 59.6, 3600 + 61, float("inf"))] == ["0:00:00", "0:01:00", "1:01:01", "?"]


def test_each_line_of_a_batched_run_shows_the_mean_loss_of_its_steps(dataset, tmp_path, base, fresh_accelerate_state,
                                                                     capsys):
    # Issue 32 saw the 100% line of a --batch_size 2 run repeat the 75% line's loss; each line must average the steps
    # since the line before, the last one ending with the last step.
    from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
    from diffsynth.training.entry import main

    result = main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(tmp_path / "out"),
                                      "--dataset_repeat", "3", "--batch_size", "2", "--progress_interval_seconds", "0"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("training: ")]
    assert lines[-1].startswith(f"training: 100% {len(result['losses'])}/{len(result['losses'])} steps")
    for line, loss in zip(lines, result["losses"], strict=True):
        assert f"loss {loss:.4f}," in line, (line, loss)
        # A step takes a batch of two samples: the rate counts both (it counted one).
        seconds, rate = (float(value) for value in re.search(r"([0-9.]+) s/step, ([0-9.]+) samples/s", line).groups())
        # (both are rounded to two decimals: s/step by at most 0.005)
        assert 2 / (seconds + 0.005) - 0.01 <= rate <= 2 / max(seconds - 0.005, 1e-9) + 0.01, line


def test_a_run_logging_to_files_writes_short_lines_and_a_line_per_interval(dataset, tmp_path, tiny_root):
    env = {**os.environ, "DIFFSYNTH_MODEL_BASE_PATH": str(tiny_root), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, str(TRAIN_PY), *raw(dataset), *COMMON, "--output_path", str(tmp_path / "out"),
            "--dataset_repeat", "1", "--num_epochs", "2", "--progress_interval_seconds", "0"]
    with open(tmp_path / "stdout.txt", "w") as stdout, open(tmp_path / "stderr.txt", "w") as stderr:
        done = subprocess.run(argv, env=env, stdout=stdout, stderr=stderr, timeout=300)
    output = (tmp_path / "stdout.txt").read_text() + (tmp_path / "stderr.txt").read_text()
    assert done.returncode == 0, output[-3000:]
    longest = max(output.splitlines(), key=len)
    assert len(longest) <= 300, longest
    assert "\r" not in output
    progress = [line for line in output.splitlines() if line.startswith("training: ")]
    assert [LINE.match(line).group(2) for line in progress] == [str(step) for step in range(1, 7)], progress
