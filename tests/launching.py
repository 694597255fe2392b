"""How the tests start several processes: ``accelerate launch`` on gloo, each launch on a port of its own.

Every launch of several processes opens a rendezvous port on this host; left to accelerate it is 29500 for all of
them, so two launches running at once (pytest-xdist's workers) would meet on one port and join each other's group.
"""

from __future__ import annotations

import socket
import sys


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's pick); a launch started right after can take it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def accelerate_launch(num_processes: int = 2, *, num_machines: int = 1, machine_rank: int = 0,
                      port: int | None = None, launcher: str = "accelerate.commands.launch") -> list[str]:
    """The command words up to the script: ``accelerate launch`` of ``num_processes`` processes in all on
    ``num_machines`` simulated machines (this one ``machine_rank``) meeting on 127.0.0.1 at ``port`` (a free one if
    None; machines of one run must be given the same). ``launcher`` may be ``diffsynth.training.launch``."""
    words = [sys.executable, "-m", launcher, "--num_processes", str(num_processes), "--num_machines",
             str(num_machines), "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
             str(port or free_port())]
    if num_processes > 1:
        words.insert(3, "--multi_gpu")
    if num_machines > 1:
        words += ["--machine_rank", str(machine_rank), "--main_process_ip", "127.0.0.1"]
    return words
