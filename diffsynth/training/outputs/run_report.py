"""``logs/report.html``: one page that shows a run at a glance, live, opened from ``file://`` with nothing to install.

The page carries its figures as JSON in ``<script type="application/json" id="run-data">`` with the keys of
:data:`RUN_DATA_KEYS`: ``status`` (one of :data:`STATUSES`), ``updated_at`` (ISO 8601), ``step``, ``total_steps``,
``loss``, ``val_loss``, ``loss_prior`` (the regularization samples' loss, ``--reg_dataset_metadata_path``) and ``lr``
(``[[step, value], ...]`` as ``logs/metrics.csv`` holds them; a non-finite value is ``null``), ``seconds_per_step``, ``eta_seconds``, ``peak_memory`` (``{"host_bytes", "device_bytes"}``), ``samples``
(``[{"step", "path", "prompt"}, ...]``, paths relative to ``logs/``) and ``config`` (the run's ``config.yaml``).

Everything a reader needs is inlined (:mod:`~diffsynth.training.outputs.report_page`): the numbers, the samples list and
the config are HTML written here, the charts SVG the page's script draws from ``run-data``; samples are relative links
into ``../samples/``. :func:`render_report` is a pure function of the data; :func:`write_report` writes the page
atomically, so a browser reloading it mid-run always reads a whole page. This module imports no torch: the
``diffsynth-launch report`` command reads pages with it (:func:`read_report`).
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ...core.files import atomic_write_text
from .report_page import RELOAD_SECONDS, SCRIPT, STYLE

REPORT_FILE = Path("logs") / "report.html"
SAMPLES_FOLDER = "samples"  # as logger.SAMPLES_DIR, restated: the logger imports torch
RUNNING, FINISHED, FAILED, STOPPED = "running", "finished", "failed", "stopped"
STATUSES = (RUNNING, FINISHED, FAILED, STOPPED)
RUN_DATA_KEYS = ("status", "updated_at", "step", "total_steps", "loss", "val_loss", "loss_prior", "lr",
                 "seconds_per_step", "eta_seconds", "peak_memory", "samples", "config")
#: The metrics.csv columns the page charts, as named in run-data.
SERIES = ("loss", "val_loss", "loss_prior", "lr")
#: In every page's head: how a folder without a record of written files knows the page as the trainer's.
REPORT_MARK = '<meta name="generator" content="diffsynth.training run report">'
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif")
_RUN_DATA = re.compile(r'<script type="application/json" id="run-data">(.*?)</script>', re.S)
_ERROR = re.compile(r'<p class="error" id="error-message">(.*?)</p>', re.S)

Series = list[list[Any]]


def finite_or_none(value: float | None) -> float | None:
    """``value`` as a JSON number, or None where JSON has none (NaN, inf: a step the non-finite guard skipped)."""
    return value if value is not None and math.isfinite(value) else None


def series_from_metrics(text: str, up_to_step: int | None = None) -> dict[str, Series]:
    """The :data:`SERIES` of a ``logs/metrics.csv`` text: ``{"loss": [[step, value], ...], ...}``, rows in order,
    empty cells left out; with ``up_to_step``, only the steps up to it (a resumed run's earlier part)."""
    series: dict[str, Series] = {name: [] for name in SERIES}
    for row in csv.DictReader(io.StringIO(text, newline="")):
        try:
            step = int(row.get("step") or "")
        except ValueError:
            continue
        if up_to_step is not None and step > up_to_step:
            continue
        for name in SERIES:
            cell = row.get(name) or ""
            try:
                series[name].append([step, finite_or_none(float(cell))])
            except ValueError:
                continue
    return series


def list_samples(output_path: str | os.PathLike, prompts: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Every sample file under ``<output_path>/samples/step-N/`` in step and file order, as run-data lists them.

    A file ``NN.png`` is the render of prompt ``NN`` (``prompts[NN]``; an empty prompt when the list is shorter, as for
    an earlier run's samples); its path is relative to ``logs/``, where the page is.
    """
    folder = Path(output_path) / SAMPLES_FOLDER
    found = []
    for step_folder in folder.glob("step-*") if folder.is_dir() else ():
        match = re.fullmatch(r"step-(\d+)", step_folder.name)
        if not match or not step_folder.is_dir():
            continue
        for file in step_folder.iterdir():
            index = re.fullmatch(r"(\d+)\.\w+", file.name)
            if index and file.is_file():
                number = int(index.group(1))
                found.append((int(match.group(1)), file.name, {
                    "step": int(match.group(1)), "path": f"../{SAMPLES_FOLDER}/{step_folder.name}/{file.name}",
                    "prompt": prompts[number] if number < len(prompts) else ""}))
    return [entry for _, _, entry in sorted(found, key=lambda item: item[:2])]


def build_run_data(*, status: str, step: int, total_steps: int, series: Mapping[str, Series],
                   seconds_per_step: float | None, eta_seconds: float | None, host_bytes: int,
                   device_bytes: int | None, samples: Sequence[Mapping[str, Any]], config: Mapping[str, Any],
                   updated_at: datetime | None = None) -> dict[str, Any]:
    """The page's ``run-data``: a dict with exactly the keys of :data:`RUN_DATA_KEYS`.

    Raises:
        ValueError: ``status`` is not one of :data:`STATUSES`.
    """
    if status not in STATUSES:
        raise ValueError(f"status {status!r} must be one of {', '.join(STATUSES)}")
    moment = updated_at or datetime.now(timezone.utc)
    return {
        "status": status, "updated_at": moment.isoformat(timespec="seconds"), "step": int(step),
        "total_steps": int(total_steps),
        **{name: [[int(point), finite_or_none(value)] for point, value in series.get(name, ())] for name in SERIES},
        "seconds_per_step": finite_or_none(seconds_per_step), "eta_seconds": finite_or_none(eta_seconds),
        "peak_memory": {"host_bytes": int(host_bytes), "device_bytes": None if device_bytes is None
                        else int(device_bytes)},
        "samples": [dict(sample) for sample in samples], "config": dict(config),
    }


def format_duration(seconds: float | None) -> str:
    """``seconds`` as ``H:MM:SS`` (``?`` when unknown), as the progress lines print it."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    minutes, second = divmod(int(round(seconds)), 60)
    hours, minute = divmod(minutes, 60)
    return f"{hours}:{minute:02d}:{second:02d}"


def format_bytes(count: int | None) -> str:
    """Bytes in the largest binary unit that keeps a whole number in front (``n/a`` when unknown)."""
    if count is None:
        return "n/a"
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def format_number(value: float | None) -> str:
    """A loss or learning rate as the page and the summary show it: four significant digits."""
    return "n/a" if value is None else f"{value:.4g}"


def last_value(points: Series) -> tuple[int, float] | None:
    """The last ``[step, value]`` with a value, or None."""
    return next(((step, value) for step, value in reversed(points) if value is not None), None)


def moving_average(points: Series) -> float | None:
    """The mean of the finite losses in the last window (a tenth of the run, 1 to 100 steps), as the chart's line."""
    window = max(1, min(100, len(points) // 10))
    values = [value for _, value in points[-window:] if value is not None]
    return sum(values) / len(values) if values else None


def _escape(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _stat(title: str, value: str, detail: str = "", ident: str = "", exact: Any = None) -> str:
    attributes = (f' id="{ident}"' if ident else "") + ("" if exact is None else f' data-value="{_escape(exact)}"')
    return (f'<div class="stat"><span>{_escape(title)}</span><b{attributes}>{_escape(value)}</b>'
            f'<span>{_escape(detail)}</span></div>')


def _stats(data: Mapping[str, Any]) -> str:
    """The figures at the top: step, ETA, speed, losses, learning rate, memory."""
    step, total = data["step"], data["total_steps"]
    percent = 100 * step / total if total else 100.0
    loss, val, lr = last_value(data["loss"]), last_value(data["val_loss"]), last_value(data["lr"])
    average = moving_average(data["loss"])
    memory = data["peak_memory"]
    speed = data["seconds_per_step"]
    cards = [
        _stat("step", f"{step} / {total}", f"{percent:.0f}%", "step", step),
        _stat("ETA", {RUNNING: format_duration(data["eta_seconds"]), FINISHED: "done"}.get(data["status"], "–"),
              "" if speed is None else f"{speed:.2f} s/step", "eta", data["eta_seconds"]),
        _stat("loss", format_number(loss and loss[1]), "" if loss is None else f"step {loss[0]}", "loss",
              loss and loss[1]),
        _stat("loss, moving average", format_number(average), "", "loss-average", average),
        _stat("val loss", format_number(val and val[1]), "" if val is None else f"step {val[0]}", "val-loss",
              val and val[1]),
        _stat("learning rate", format_number(lr and lr[1]), "", "lr", lr and lr[1]),
        _stat("peak memory", format_bytes(memory["host_bytes"]), "host", "host-memory", memory["host_bytes"]),
        _stat("peak device memory", format_bytes(memory["device_bytes"]), "device", "device-memory",
              memory["device_bytes"]),
    ]
    return (f'<section class="card wide"><div class="stats">{"".join(cards)}</div>'
            f'<div class="bar"><div style="width:{min(percent, 100):.1f}%"></div></div></section>')


def _figure(sample: Mapping[str, Any]) -> str:
    path, prompt = _escape(sample["path"]), _escape(sample["prompt"])
    is_image = sample["path"].lower().endswith(IMAGE_SUFFIXES) or sample["path"].startswith("data:image/")
    media = (f'<img src="{path}" alt="{prompt}" loading="lazy">' if is_image
             else f'<video src="{path}" controls muted loop playsinline preload="metadata"></video>')
    return (f'<figure>{media}<figcaption>step {int(sample["step"])}'
            f'{" · " + prompt if prompt else ""}</figcaption></figure>')


def _samples(samples: Sequence[Mapping[str, Any]]) -> str:
    """The newest step's samples, and the earlier steps' a click away, newest first."""
    if not samples:
        body = ('<p class="muted">No samples yet: pass --validation_prompts (and --validation_steps) to render some '
                'while training.</p>')
        return f'<section class="card wide"><h2>samples</h2>{body}</section>'
    by_step: dict[int, list[Mapping[str, Any]]] = {}
    for sample in samples:
        by_step.setdefault(int(sample["step"]), []).append(sample)
    steps = sorted(by_step, reverse=True)
    latest = "".join(_figure(sample) for sample in by_step[steps[0]])
    earlier = "".join(f'<details id="samples-step-{step}"><summary>step {step} ({len(by_step[step])})</summary>'
                      f'<div class="samples">{"".join(_figure(sample) for sample in by_step[step])}</div></details>'
                      for step in steps[1:])
    return (f'<section class="card wide"><h2>samples at step {steps[0]}</h2><div class="samples">{latest}</div>'
            f'{earlier}</section>')


def _config(config: Mapping[str, Any]) -> str:
    rows = "".join(f"<tr><td>{_escape(name)}</td><td>{_escape(json.dumps(value, ensure_ascii=False))}</td></tr>"
                   for name, value in config.items() if value is not None)
    return (f'<section class="card wide"><details id="config"><summary>config (config.yaml, flags that are set)'
            f'</summary><table>{rows}</table></details></section>')


def run_data_json(data: Mapping[str, Any]) -> str:
    """``data`` as JSON that is safe inside ``<script>`` (no ``</script>`` can end it early)."""
    return (json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
            .replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


def render_report(data: Mapping[str, Any], error: str | None = None, title: str | None = None) -> str:
    """The page for ``data`` (:func:`build_run_data`): a pure function, the same data giving the same page.

    Args:
        data: The run-data.
        error: The one-line message of the error a failed run stopped on, shown under the status.
        title: The page's heading; None uses ``config["output_path"]``.
    """
    status = data["status"]
    heading = title or str(data["config"].get("output_path") or "training run")
    error_html = f'<p class="error" id="error-message">{_escape(error)}</p>' if error else ""
    charts = ('<section class="card wide"><h2>loss</h2><div class="legend"><span><i style="background:var(--loss)">'
              '</i>loss per step</span><span><i style="background:var(--avg)"></i>moving average</span><span><i '
              'style="background:var(--val)"></i>val loss</span></div><svg class="chart" id="loss-chart" role="img" '
              'aria-label="loss per optimizer step"></svg></section><section class="card wide"><h2>learning rate</h2>'
              '<svg class="chart" id="lr-chart" role="img" aria-label="learning rate per optimizer step"></svg>'
              '</section>')
    reload_note = f"reloads every {RELOAD_SECONDS} s" if status == RUNNING else "final"
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<link rel="icon" href="data:,">', REPORT_MARK,  # no favicon request, on file:// or served
        f"<title>{_escape(status)} · {_escape(Path(heading).name or heading)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f'<header><h1>{_escape(heading)}</h1><span class="status {_escape(status)}" id="status">{_escape(status)}'
        f'</span><span class="muted">updated <time id="updated" datetime="{_escape(data["updated_at"])}">'
        f'{_escape(data["updated_at"])}</time> · {reload_note}</span>{error_html}</header>',
        f"<main>{_stats(data)}{charts}{_samples(data['samples'])}{_config(data['config'])}</main>",
        f'<script type="application/json" id="run-data">{run_data_json(data)}</script>',
        f"<script>{SCRIPT.replace('RELOAD_MS', str(RELOAD_SECONDS * 1000))}</script>",
        "</body></html>", ""])


def write_report(output_path: str | os.PathLike, data: Mapping[str, Any], error: str | None = None) -> Path:
    """Writes ``<output_path>/logs/report.html`` for ``data`` atomically; returns its path."""
    return atomic_write_text(Path(output_path) / REPORT_FILE, render_report(data, error))


def read_report(path: str | os.PathLike) -> tuple[dict[str, Any], str | None]:
    """The run-data and the error message of a page :func:`write_report` wrote.

    Raises:
        ValueError: The file holds no run-data (not a report page).
    """
    text = Path(path).read_text(encoding="utf-8")
    match = _RUN_DATA.search(text)
    if match is None:
        raise ValueError(f"{path} holds no run-data: it is not a report page diffsynth wrote")
    error = _ERROR.search(text)
    return json.loads(match.group(1)), html.unescape(error.group(1)) if error else None


def one_line(error: BaseException) -> str:
    """An error's message on one line: its first non-empty line, or its type's name when it has none."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def prompts_of(entries: Iterable[Any]) -> list[str]:
    """The prompt text of each validation entry (an object with ``prompt``, or a string)."""
    return [str(getattr(entry, "prompt", entry)) for entry in entries]
