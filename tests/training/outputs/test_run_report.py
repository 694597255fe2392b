"""The run report page: its run-data (keys, values equal to metrics.csv), statuses, samples, atomic writes, the
timing of the live writer."""

import json
import math
from datetime import datetime, timezone

import pytest
import torch
from PIL import Image

from diffsynth.training.loop.live_report import LiveReport
from diffsynth.training.outputs.logger import ModelLogger
from diffsynth.training.outputs.run_report import (
    REPORT_FILE,
    RUN_DATA_KEYS,
    build_run_data,
    list_samples,
    one_line,
    read_report,
    render_report,
    series_from_metrics,
    write_report,
)


class Clock:
    def __init__(self):
        self.now = 50.0

    def __call__(self):
        return self.now


def data(**changes):
    values = dict(status="running", step=2, total_steps=10, series={"loss": [[1, 0.5], [2, 0.25]], "lr": [[1, 1e-4]]},
                  seconds_per_step=1.5, eta_seconds=12.0, host_bytes=3 * 2**30, device_bytes=None, samples=[],
                  config={"output_path": "/runs/a", "learning_rate": 1e-4},
                  updated_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc))
    return build_run_data(**{**values, **changes})


def test_run_data_has_exactly_the_documented_keys_and_round_trips_through_the_page(tmp_path):
    run = data()
    assert tuple(run) == RUN_DATA_KEYS
    assert run["updated_at"] == "2026-01-02T03:04:05+00:00" and run["val_loss"] == []
    assert run["peak_memory"] == {"host_bytes": 3 * 2**30, "device_bytes": None}
    path = write_report(tmp_path, run, "boom: the disk is full")
    assert path == tmp_path / REPORT_FILE
    assert read_report(path) == (run, "boom: the disk is full")
    assert not list(path.parent.glob(".*.tmp"))  # written through a temporary file, renamed


def test_a_non_finite_loss_is_null_and_the_page_cannot_be_closed_early_by_a_prompt():
    run = data(series={"loss": [[1, math.nan], [2, math.inf]]},
               samples=[{"step": 2, "path": "../samples/step-2/00.png", "prompt": "a </script><b>cat</b>"}])
    assert run["loss"] == [[1, None], [2, None]]
    page = render_report(run)
    assert page.count("</script>") == 2  # the JSON's and the page script's
    assert "a &lt;/script&gt;&lt;b&gt;cat&lt;/b&gt;" in page  # the caption, escaped
    assert "NaN" not in page.split('id="run-data">')[1].split("</script>")[0]


@pytest.mark.parametrize("status", ["running", "finished", "failed", "stopped"])
def test_each_status_is_shown_and_only_a_running_page_reloads(status):
    page = render_report(data(status=status), "the error" if status == "failed" else None)
    assert f'<span class="status {status}" id="status">{status}</span>' in page
    assert ("reloads every 10 s" in page) == (status == "running")
    assert ('id="error-message">the error<' in page) == (status == "failed")
    assert 'if (data.status === "running") setTimeout' in page and "10000" in page
    assert "http://" not in page.replace('"http://www.w3.org/2000/svg"', "")  # nothing linked but the SVG namespace
    assert "https://" not in page


def test_an_unknown_status_is_refused():
    with pytest.raises(ValueError, match="status 'done' must be one of running, finished, failed, stopped"):
        data(status="done")


def test_samples_are_listed_with_their_prompt_relative_to_the_page(tmp_path):
    for step in (10, 2):
        for index in range(2):
            (tmp_path / "samples" / f"step-{step}").mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (8, 8)).save(tmp_path / "samples" / f"step-{step}" / f"{index:02d}.png")
    (tmp_path / "samples" / "notes").mkdir()
    assert list_samples(tmp_path, ["a cat"]) == [
        {"step": 2, "path": "../samples/step-2/00.png", "prompt": "a cat"},
        {"step": 2, "path": "../samples/step-2/01.png", "prompt": ""},
        {"step": 10, "path": "../samples/step-10/00.png", "prompt": "a cat"},
        {"step": 10, "path": "../samples/step-10/01.png", "prompt": ""}]
    page = render_report(data(samples=list_samples(tmp_path, ["a cat"])))
    latest, earlier = page.split('<details id="samples-step-2">')
    assert "samples at step 10" in latest and latest.count("<img") == 2 and earlier.count("<img") == 2


def test_one_line_takes_the_first_line_of_a_message():
    assert one_line(RuntimeError("\n  out of memory  \nmore")) == "out of memory"
    assert one_line(KeyError()) == "KeyError"


def test_the_page_of_a_logger_run_equals_its_metrics_csv(tmp_path):
    clock = Clock()
    with ModelLogger(tmp_path, enable_csv_log=True) as logger:
        report = LiveReport(tmp_path, 4, 30.0, logger.logged_series, clock=clock)
        written = []
        for step, loss in enumerate([0.5, float("nan"), 0.25, 0.125], start=1):
            # val_loss on some rows only, in the header from the first (as the validation loss logs it)
            logger.on_step_end(step, torch.tensor(loss), 1e-3 / step, dict,
                               {"val_loss": 0.1 * step} if step in (1, 3) else None)
            clock.now += 10
            written.append(report.update(step, force=step == 4) is not None)
        report.end("finished")
    # After the first step, not within the interval, then at a forced write (a save).
    assert written == [True, False, False, True]
    run, error = read_report(tmp_path / REPORT_FILE)
    assert error is None and run["status"] == "finished" and run["step"] == 4 and run["eta_seconds"] == 0.0
    csv_series = series_from_metrics((tmp_path / "logs" / "metrics.csv").read_text())
    assert [run["loss"], run["lr"], run["val_loss"]] == [csv_series["loss"], csv_series["lr"], csv_series["val_loss"]]
    assert run["loss"][1] == [2, None] and run["val_loss"] == [[1, 0.1], [3, 0.1 * 3]]
    assert run["seconds_per_step"] == pytest.approx(10.0)
    assert run["peak_memory"]["host_bytes"] > 0 and run["peak_memory"]["device_bytes"] is None
    assert json.loads(json.dumps(run)) == run


def test_a_resumed_run_shows_the_earlier_steps_from_metrics_csv(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "metrics.csv").write_text("step,loss,lr\n1,0.5,0.001\n2,0.4,0.001\n3,0.9,0.001\n")
    series = {"loss": [[3, 0.3]], "lr": [[3, 0.001]]}
    report = LiveReport(tmp_path, 5, 30.0, series, initial_step=2, clock=Clock())
    report.update(3)
    run, _ = read_report(tmp_path / REPORT_FILE)
    assert run["loss"] == [[1, 0.5], [2, 0.4], [3, 0.3]] and run["step"] == 3


def test_a_report_that_cannot_be_written_warns_and_training_goes_on(tmp_path, caplog):
    (tmp_path / "logs").write_text("a file where the folder goes")
    report = LiveReport(tmp_path, 5, 30.0, {}, clock=Clock())
    assert report.update(1) is None
    assert "could not write the run report" in caplog.text


def test_a_process_other_than_the_main_one_writes_nothing(tmp_path):
    report = LiveReport(tmp_path, 5, 30.0, {}, enabled=False, clock=Clock())
    assert report.update(1) is None and report.end("failed", "x") is None
    assert not (tmp_path / REPORT_FILE).exists()
