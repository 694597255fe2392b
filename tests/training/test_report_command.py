"""``diffsynth-launch report``: the page's path and the run in text, without torch; ``--serve`` serves the folder
read-only on localhost."""

import http.client
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from diffsynth.training.outputs.run_report import build_run_data, write_report
from diffsynth.training.report_command import make_server, summary_lines

REPO = Path(__file__).resolve().parents[2]
UPDATED = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


@pytest.fixture
def run_folder(tmp_path):
    data = build_run_data(status="failed", step=40, total_steps=100,
                          series={"loss": [[step, 1.0 / step] for step in range(1, 41)],
                                  "val_loss": [[20, 0.07]], "lr": [[40, 2e-4]]},
                          seconds_per_step=1.25, eta_seconds=75.0, host_bytes=5 * 2**30, device_bytes=3 * 2**30,
                          samples=[{"step": 20, "path": "../samples/step-20/00.png", "prompt": "a cat"}],
                          config={"lora_rank": 16, "learning_rate": 2e-4, "output_path": str(tmp_path)},
                          updated_at=UPDATED)
    write_report(tmp_path, data, "CUDA out of memory")
    return tmp_path, data


def test_report_prints_the_page_and_a_summary_without_importing_torch(run_folder):
    folder, _ = run_folder
    code = ("import sys; from diffsynth.training.launch import main; code = main(sys.argv[1:]); "
            "heavy = sorted(m for m in ('torch', 'diffusers', 'transformers', 'accelerate') if m in sys.modules); "
            "print(f'exit {code}, heavy {heavy}')")
    done = subprocess.run([sys.executable, "-c", code, "report", str(folder)], cwd=REPO, capture_output=True,
                          text=True, check=True)
    page = (folder / "logs" / "report.html").resolve()
    assert done.stdout.splitlines() == [
        f"report: {page}", f"  open {page.as_uri()} in a browser",
        "status: failed, updated 2026-01-02T03:04:05+00:00", "  CUDA out of memory",
        "step: 40/100, 1.25 s/step",
        "loss: 0.025 at step 40, moving average 0.026; val_loss 0.07 at step 20",
        "learning rate: 0.0002", "peak memory: host 5.0 GiB, device 3.0 GiB",
        "samples: 1 in all; at step 20:", "  samples/step-20/00.png  a cat",
        "flags: lora_rank 16, learning_rate 0.0002", "exit 0, heavy []"]


def test_a_running_page_without_updates_says_it_may_be_stale(run_folder):
    _, data = run_folder
    lines = summary_lines({**data, "status": "running"}, None, UPDATED + timedelta(hours=1))
    assert lines[0].endswith("(no update for 1:00:00: the run may have been killed)")
    assert lines[1] == "step: 40/100, 1.25 s/step, ETA 0:01:15"


def test_a_folder_without_a_report_is_refused(tmp_path):
    done = subprocess.run([sys.executable, "-m", "diffsynth.training.launch", "report", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "writes it at the end of its first optimizer step" in done.stderr


def test_serve_answers_get_on_localhost_and_refuses_writes(run_folder):
    folder, _ = run_folder
    server = make_server(folder, port=0)
    host, port = server.server_address[:2]
    assert host == "127.0.0.1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        connection = http.client.HTTPConnection(host, port, timeout=10)
        connection.request("GET", "/logs/report.html")
        response = connection.getresponse()
        assert response.status == 200 and b'id="run-data"' in response.read()
        for method in ("POST", "PUT", "DELETE"):
            connection.request(method, "/logs/report.html", body=b"x")
            response = connection.getresponse()
            response.read()
            assert response.status == 405
        connection.request("HEAD", "/logs/report.html")
        response = connection.getresponse()
        response.read()
        assert response.status == 200
    finally:
        server.shutdown()
        server.server_close()
    assert (folder / "logs" / "report.html").read_text().count('id="run-data"') == 1
