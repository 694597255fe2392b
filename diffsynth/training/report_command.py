"""``diffsynth-launch report OUTPUT_PATH``: where a run's report page is, and the run on one screen of text.

    diffsynth-launch report OUTPUT_PATH [--serve PORT [--host HOST]]

The page is ``<OUTPUT_PATH>/logs/report.html`` (:mod:`diffsynth.training.outputs.run_report`), which a run keeps
current while it trains; open it in a browser from the file system. ``--serve PORT`` serves the output folder, read
only (GET and HEAD; anything else is refused with 405), for a browser on another machine, through an ssh tunnel
(``ssh -L PORT:127.0.0.1:PORT host``): it binds 127.0.0.1 unless ``--host`` says otherwise, and 0 takes a free port.
It imports no torch, so it answers at once.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from .outputs.run_report import (
    REPORT_FILE,
    RUNNING,
    format_bytes,
    format_duration,
    format_number,
    last_value,
    moving_average,
    read_report,
)

#: Exit codes as :mod:`diffsynth.training.exit_codes` (which imports torch): done, and input to fix.
SUCCESS, USAGE = 0, 2
#: A running page older than this says it may be stale (a run killed without warning leaves "running").
STALE_SECONDS = 600


def summary_lines(data: Mapping[str, Any], message: str | None, now: datetime | None = None) -> list[str]:
    """The run on a few lines of text: status, step, speed, losses, learning rate, memory, samples, flags."""
    status, step, total = data["status"], data["step"], data["total_steps"]
    updated = datetime.fromisoformat(data["updated_at"])
    age = ((now or datetime.now(updated.tzinfo)) - updated).total_seconds()
    stale = (f" (no update for {format_duration(age)}: the run may have been killed)"
             if status == RUNNING and age > STALE_SECONDS else "")
    lines = [f"status: {status}, updated {data['updated_at']}{stale}"]
    if message:
        lines.append(f"  {message}")
    speed = data["seconds_per_step"]
    lines.append(f"step: {step}/{total}" + ("" if speed is None else f", {speed:.2f} s/step")
                 + (f", ETA {format_duration(data['eta_seconds'])}" if status == RUNNING else ""))
    loss, val, lr = last_value(data["loss"]), last_value(data["val_loss"]), last_value(data["lr"])
    if loss is not None:
        lines.append(f"loss: {format_number(loss[1])} at step {loss[0]}, moving average "
                     f"{format_number(moving_average(data['loss']))}"
                     + ("" if val is None else f"; val_loss {format_number(val[1])} at step {val[0]}"))
    if lr is not None:
        lines.append(f"learning rate: {format_number(lr[1])}")
    memory = data["peak_memory"]
    lines.append(f"peak memory: host {format_bytes(memory['host_bytes'])}, device "
                 f"{format_bytes(memory['device_bytes'])}")
    samples = data["samples"]
    if samples:
        newest = max(sample["step"] for sample in samples)
        lines.append(f"samples: {len(samples)} in all; at step {newest}:")
        lines += [f"  {sample['path'].removeprefix('../')}  {sample['prompt']}" for sample in samples
                  if sample["step"] == newest][:8]
    config = data["config"]
    shown = [f"{name} {config[name]}" for name in ("model_id_with_origin_paths", "lora_base_model", "lora_rank",
                                                    "learning_rate", "num_epochs", "max_train_steps") if config.get(name)]
    if shown:
        lines.append("flags: " + ", ".join(shown))
    return lines


class ReadOnlyHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files for GET and HEAD; every other method is refused with 405 Method Not Allowed."""

    def _refuse(self) -> None:
        self.send_error(405, "read-only: this server answers GET and HEAD only")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _refuse

    def end_headers(self) -> None:
        self.send_header("Cache-Control", "no-store")  # a reload shows the page the run last wrote
        super().end_headers()


def make_server(folder: str | os.PathLike, host: str = "127.0.0.1", port: int = 0) -> http.server.HTTPServer:
    """A server of ``folder``'s files, read-only, bound to ``host``:``port`` (0: a free port); not started yet."""
    handler = functools.partial(ReadOnlyHandler, directory=str(folder))
    return http.server.ThreadingHTTPServer((host, port), handler)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="diffsynth-launch report",
                                     description="Where a training run's report page is, and its state in text.")
    parser.add_argument("output_path", help="The run's --output_path.")
    parser.add_argument("--serve", type=int, metavar="PORT",
                        help="Serve the output folder read-only on this port (0: a free one) for a browser elsewhere.")
    parser.add_argument("--host", default="127.0.0.1",
                        help="The address --serve binds (default 127.0.0.1: this machine only; reach it through ssh "
                             "-L PORT:127.0.0.1:PORT).")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the report's path and summary; with ``--serve``, serves the folder until Ctrl-C. Returns the exit
    code: 2 when the folder holds no report."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    folder = Path(args.output_path)
    page = folder / REPORT_FILE
    try:
        data, message = read_report(page)
    except FileNotFoundError:
        print(f"report: no {page}: a training run writes it at the end of its first optimizer step; pass the run's "
              "--output_path (the folder that holds config.yaml and logs/)", file=sys.stderr)
        return USAGE
    except ValueError as error:
        print(f"report: {error}", file=sys.stderr)
        return USAGE
    print(f"report: {page.resolve()}\n  open {page.resolve().as_uri()} in a browser")
    print("\n".join(summary_lines(data, message)), flush=True)
    if args.serve is None:
        return SUCCESS
    server = make_server(folder, args.host, args.serve)
    host, port = server.server_address[:2]
    print(f"serving {folder.resolve()} read-only at http://{host}:{port}/{REPORT_FILE.as_posix()} (Ctrl-C stops)"
          + (f"; from another machine: ssh -L {port}:127.0.0.1:{port} <this host>" if host == "127.0.0.1" else ""),
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return SUCCESS

