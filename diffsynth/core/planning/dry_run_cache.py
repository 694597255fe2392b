"""The planner's dry-run results kept on disk, so that planning the same run again skips its dry runs.

A dry run (``footprint.measure_step``, ``residency.simulate_leaf_offload``) takes seconds of meta-device work for a
released model, and gives the same numbers for the same model, inputs and mode wherever the budgets, the device
profile or the process count change. Users plan one run against several devices and budgets, and the trainer plans
its placement again at start-up, so each result is written once to a small JSON file and read back after.

A result is found under a fingerprint of everything it follows from: the meta model's config, its modules' classes
and settings, and its tensors' names, shapes, dtypes and trainability; the step's inputs; the mode of the run (the
entry's name); and the code that runs it: the versions of torch, diffusers and peft, and the bytes of this package's
source. A file that does not read back as the result it should be is ignored and written anew.

The folder is ``$DIFFSYNTH_PLAN_CACHE``, else ``$XDG_CACHE_HOME/diffsynth/plan`` (``~/.cache/diffsynth/plan``);
``DIFFSYNTH_PLAN_CACHE=off`` keeps nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from ..files import atomic_write_json

logger = logging.getLogger(__name__)

CACHE_ENV = "DIFFSYNTH_PLAN_CACHE"
PACKAGE = Path(__file__).resolve().parents[2]

Result = TypeVar("Result")


def cache_folder() -> Path | None:
    """Where results are kept; None when ``DIFFSYNTH_PLAN_CACHE=off``."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen is not None:
        return None if chosen.strip().lower() == "off" else Path(chosen)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "diffsynth" / "plan"


@functools.lru_cache(maxsize=1)
def _code_version() -> str:
    import diffusers
    import peft

    digest = hashlib.sha256(f"torch {torch.__version__} diffusers {diffusers.__version__} "
                            f"peft {peft.__version__}".encode())
    for source in sorted(PACKAGE.rglob("*.py")):
        digest.update(str(source.relative_to(PACKAGE)).encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()


def _tensor_line(name: str, tensor: torch.Tensor) -> str:
    return f"{name} {tuple(tensor.shape)} {tensor.dtype} {tensor.requires_grad}"


def workload_fingerprint(model: nn.Module, inputs: Iterable[tuple[str, Any]]) -> str:
    """The fingerprint of ``model`` (on the meta device) stepped on ``inputs`` (name, value), with this code."""
    digest = hashlib.sha256(_code_version().encode())
    # Shapes alone leave out what a forward reads from its config (24 heads of 128 or 48 of 64 weigh the same).
    # Keys with an underscore are diffusers' bookkeeping (a set among them, in no fixed order).
    config = {key: value for key, value in dict(getattr(model, "config", None) or {}).items()
              if not key.startswith("_")}
    digest.update(json.dumps(config, sort_keys=True, default=str).encode())
    for name, module in model.named_modules():
        kind = f"{type(module).__module__}.{type(module).__qualname__}"
        digest.update(f"{name} {kind} {module.extra_repr()}\n".encode())
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        digest.update(_tensor_line(name, tensor).encode() + b"\n")
    for name, value in inputs:
        line = _tensor_line(name, value) if isinstance(value, torch.Tensor) else f"{name} {value!r}"
        digest.update(line.encode() + b"\n")
    return digest.hexdigest()[:32]


class DryRunCache:
    """Dry-run results of one workload, by the name of what was run.

    Args:
        fingerprint: :func:`workload_fingerprint` of the workload.
        folder: Where the results are kept; None keeps nothing (each result is run).
    """

    def __init__(self, fingerprint: str, folder: Path | None) -> None:
        self.fingerprint, self.folder = fingerprint, folder

    def result(self, name: str, kind: type[Result], run: Callable[[], Result]) -> Result:
        """The result ``name`` (a dataclass ``kind``) from the folder, or from ``run()``, written there after."""
        if self.folder is None:
            return run()
        path = self.folder / f"{self.fingerprint}-{name}.json"
        try:
            return kind(**json.loads(path.read_text()))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError) as error:
            logger.debug("planner cache %s is unreadable (%s); running it again", path, error)
        value = run()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, dataclasses.asdict(value))
        except OSError as error:  # a read-only or full disk costs the next plan its time, nothing else
            logger.debug("planner cache %s not written: %s", path, error)
        return value
