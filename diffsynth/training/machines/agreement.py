"""Every process of a run must run the same code with the same flags: checked once, at start-up, across machines.

On one machine every process is started by one launcher from one command, so they cannot differ. Over several
machines each machine's launcher is started by hand (or by a scheduler's script), and a machine with another checkout,
another installed version or one flag typed differently would train something else, or hang at the first collective
whose shapes disagree. Each process therefore sends its identity (a digest of the diffsynth package and the training
script it runs, and its resolved flags) to all others before anything loads, and every process refuses to start,
naming the first machine that differs and how.

``--output_path`` is left out of the comparison: each machine may write into a folder of its own local disk (only the
main process writes there; see :mod:`diffsynth.training.outputs.separate_disks`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import sys
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import RunConfig

PACKAGE = Path(__file__).resolve().parents[2]
# Flags that may differ between machines: where each machine's own outputs go.
PER_MACHINE_FLAGS = frozenset({"output_path"})


@lru_cache(maxsize=None)
def _files_digest(root: Path, script: str) -> str:
    """A digest of every ``.py`` file of the package under ``root`` and of ``script``, by path and content."""
    digest = hashlib.sha256()
    files = sorted(root.rglob("*.py"))
    if script and Path(script).is_file():
        files.append(Path(script).resolve())
    for path in files:
        digest.update(path.relative_to(root.parent).as_posix().encode() if path.is_relative_to(root.parent)
                      else path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class ProcessIdentity:
    """What one process is: where it runs and what it runs.

    Attributes:
        rank: Its global rank.
        machine: Its machine's rank in the launch (torchrun's ``GROUP_RANK``), or -1 where the launcher sets none.
        host: Its host name.
        version: diffsynth's version.
        code: The digest of the package's source files and the training script.
        flags: Its resolved flags, without those that may differ per machine.
    """

    rank: int
    machine: int
    host: str
    version: str
    code: str
    flags: dict[str, Any]

    @classmethod
    def of_this_process(cls, config: RunConfig, rank: int) -> ProcessIdentity:
        from ... import __version__

        flags = {name: value for name, value in config.to_flags().items() if name not in PER_MACHINE_FLAGS}
        # Through JSON, so that tuples and lists compare alike after the trip between processes.
        flags = json.loads(json.dumps(flags, default=str, sort_keys=True))
        return cls(rank, int(os.environ.get("GROUP_RANK", "-1")), socket.gethostname(), __version__,
                   _files_digest(PACKAGE, sys.argv[0]), flags)

    def where(self) -> str:
        """E.g. ``rank 2 (machine 1, host node-b)``."""
        machine = f"machine {self.machine}, " if self.machine >= 0 else ""
        return f"rank {self.rank} ({machine}host {self.host})"


def gather_identities(config: RunConfig, accelerator: Any) -> list[ProcessIdentity]:
    """Every process's identity, in rank order (none for a single process, which has nothing to agree with); a
    collective: every process must call it."""
    if accelerator.num_processes == 1:
        return []
    from accelerate.utils import gather_object

    mine = ProcessIdentity.of_this_process(config, accelerator.process_index)
    return [ProcessIdentity(**one) for one in gather_object([dataclasses.asdict(mine)])]


def _flag_text(value: Any) -> str:
    return "(unset)" if value is None else json.dumps(value) if not isinstance(value, str) else value


def agreement_problems(identities: list[ProcessIdentity]) -> list[str]:
    """One problem for the first process whose code or flags differ from the main process's, naming the
    difference; none when all agree."""
    main, *others = identities or [None]
    for other in others:
        if (other.version, other.code) != (main.version, main.code):
            return [(f"{other.where()} runs other code than the main process {main.where()}: diffsynth "
                     f"{other.version} (source digest {other.code}) there, {main.version} ({main.code}) here; install "
                     "the same diffsynth version and checkout of the training script on every machine, then start "
                     "them again")]
        differing = sorted(name for name in main.flags.keys() | other.flags.keys()
                           if main.flags.get(name) != other.flags.get(name))
        if differing:
            shown = "; ".join(f"--{name} {_flag_text(other.flags.get(name))} there, "
                              f"{_flag_text(main.flags.get(name))} on the main process" for name in differing[:5])
            more = f" (and {len(differing) - 5} more)" if len(differing) > 5 else ""
            return [(f"{other.where()} was started with other flags than the main process {main.where()}: "
                     f"{shown}{more}; start every machine with the same flags (only --output_path may differ)")]
    return []
