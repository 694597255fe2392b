"""The run report page of a real run on the tiny Qwen-Image: written after the first step, at every save and at the
end (finished), with the metrics, samples and config of the run; failed with the message on an error after training
began; stopped on SIGTERM."""

import os
import signal

import pytest
import yaml

from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.training.entry import main
from diffsynth.training.loop import live_report
from diffsynth.training.loop.preemption import RunPreempted
from diffsynth.training.outputs.logger import ModelLogger
from diffsynth.training.outputs.run_report import REPORT_FILE, read_report, series_from_metrics
from tests.training.test_trainer import COMMON, raw

PROMPTS = "a red circle\na blue square\n"


@pytest.fixture(autouse=True)
def in_process_runs(base, fresh_accelerate_state):
    """Every test here runs the trainer in-process on the tiny repos."""


@pytest.fixture
def writes(monkeypatch):
    """Every page the run writes, as ``(status, step, data, message)``."""
    seen = []
    write = live_report.write_report

    def recording(output_path, data, message=None):
        seen.append((data["status"], data["step"], data, message))
        return write(output_path, data, message)

    monkeypatch.setattr(live_report, "write_report", recording)
    return seen


def run(dataset, output, *extra):
    return main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(output), "--num_epochs", "2",
                                    "--progress_interval_seconds", "100000", "--enable_csv_log", *extra])


def test_a_run_writes_its_page_after_the_first_step_at_every_save_and_finished_at_the_end(dataset, tmp_path,
                                                                                         writes):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PROMPTS)
    output = tmp_path / "out"
    result = run(dataset, output, "--save_steps", "2", "--validation_prompts", str(prompts),
                 "--validation_steps", "4", "--validation_num_inference_steps", "1")
    assert result["global_step"] == 6
    # Step 1 (the first), the saves at 2, 4 and 6 (4 also renders samples), the epoch ends 3 and 6, then the end.
    assert [(status, step) for status, step, _, _ in writes] == [
        ("running", 1), ("running", 2), ("running", 3), ("running", 4), ("running", 6), ("running", 6),
        ("finished", 6)]
    page, message = read_report(output / REPORT_FILE)
    assert page == writes[-1][2] and message is None
    assert page["total_steps"] == 6 and page["eta_seconds"] == 0.0 and page["seconds_per_step"] > 0
    metrics = series_from_metrics((output / "logs" / "metrics.csv").read_text())
    assert page["loss"] == metrics["loss"] and page["lr"] == metrics["lr"] and len(page["loss"]) == 6
    assert page["val_loss"] == metrics["val_loss"]
    assert page["config"] == yaml.safe_load((output / "config.yaml").read_text())
    assert page["samples"] == [{"step": 4, "path": f"../samples/step-4/0{index}.png", "prompt": prompt}
                               for index, prompt in enumerate(["a red circle", "a blue square"])]
    assert all((output / "logs" / sample["path"]).is_file() for sample in page["samples"])
    assert page["peak_memory"]["host_bytes"] > 0


def test_a_run_that_fails_after_training_began_writes_failed_with_the_message(dataset, tmp_path, writes,
                                                                           monkeypatch):
    on_step_end = ModelLogger.on_step_end

    def failing(self, step, *args, **kwargs):
        if step == 2:
            raise RuntimeError("the GPU fell off the bus\n(details that stay out of the page)")
        return on_step_end(self, step, *args, **kwargs)

    monkeypatch.setattr(ModelLogger, "on_step_end", failing)
    with pytest.raises(RuntimeError, match="fell off"):
        run(dataset, tmp_path / "out")
    page, message = read_report(tmp_path / "out" / REPORT_FILE)
    assert page["status"] == "failed" and message == "the GPU fell off the bus" and page["step"] == 2
    assert [(status, step) for status, step, _, _ in writes] == [("running", 1), ("failed", 2)]


def test_a_run_stopped_by_sigterm_writes_stopped(dataset, tmp_path, writes, monkeypatch):
    on_step_end = ModelLogger.on_step_end

    def signalled(self, step, *args, **kwargs):
        if step == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return on_step_end(self, step, *args, **kwargs)

    monkeypatch.setattr(ModelLogger, "on_step_end", signalled)
    with pytest.raises(RunPreempted):
        run(dataset, tmp_path / "out")
    page, message = read_report(tmp_path / "out" / REPORT_FILE)
    assert page["status"] == "stopped" and "SIGTERM" in message and "--resume_from_checkpoint latest" in message
