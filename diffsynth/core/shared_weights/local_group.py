"""The processes of a run that share one machine, and the few collectives loading a shared copy needs.

Machines are told apart by host name and boot id, gathered from every process once, so the grouping holds for any
launcher (``accelerate launch``, ``torchrun``, several nodes) without trusting environment variables to join
processes. The launcher's node rank (torchrun's ``GROUP_RANK``, set by ``accelerate launch --machine_rank``) only
splits them further: processes of two launch nodes never share a host copy, even when both nodes are one host. The
collectives run on torch.distributed's default group: every process of the run calls them in the same order,
including processes alone on their machine, so a run spread over machines with different process counts stays in
step.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path
from typing import Any

import torch.distributed as dist

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
NODE_RANK_ENV = "GROUP_RANK"


def machine_key() -> str:
    """What identifies this machine among the run's: its host name and, where the kernel tells it, its boot id
    (containers on different hosts may share a host name), and the launcher's node rank where it sets one."""
    boot = _BOOT_ID.read_text().strip() if _BOOT_ID.is_file() else ""
    return f"{socket.gethostname()}/{boot}/{os.environ.get(NODE_RANK_ENV, '')}"


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@dataclasses.dataclass(frozen=True)
class LocalGroup:
    """This process's place among the run's processes on its machine.

    Attributes:
        members: Global ranks of the processes on this machine, ascending; the first is the local main process.
        global_rank: This process's rank in the run.
        world_size: Processes in the whole run.
    """

    members: tuple[int, ...] = (0,)
    global_rank: int = 0
    world_size: int = 1

    @classmethod
    def of_this_process(cls) -> LocalGroup:
        """Finds the processes on this machine; a collective: every process of the run must call it."""
        rank, world = _world()
        if world == 1:
            return cls()
        keys: list[Any] = [None] * world
        dist.all_gather_object(keys, machine_key())
        members = tuple(index for index, key in enumerate(keys) if key == keys[rank])
        return cls(members, rank, world)

    @property
    def size(self) -> int:
        """Processes on this machine."""
        return len(self.members)

    @property
    def rank(self) -> int:
        """This process's index among them (0: the local main process)."""
        return self.members.index(self.global_rank)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def gather(self, value: Any) -> list[Any]:
        """Every local process's ``value``, in local rank order; a collective of the whole run."""
        if self.world_size == 1:
            return [value]
        values: list[Any] = [None] * self.world_size
        dist.all_gather_object(values, value)
        return [values[member] for member in self.members]

    def from_main(self, value: Any) -> Any:
        """The local main process's ``value``, in every process of the machine (others pass anything, e.g. None)."""
        return self.gather(value)[0]
