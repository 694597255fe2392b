"""Runs a test function in several spawned processes joined in a gloo group, as ranks of one run on this machine."""

import json
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank: int, size: int, folder: str, collective_timeout: float, worker, args: tuple) -> None:
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=size,
                            timeout=timedelta(seconds=collective_timeout))
    try:
        result = worker(*args)
        Path(folder, f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()  # no rank exits (dropping its mappings) before every rank has measured
    finally:
        dist.destroy_process_group()


def run_ranks(worker, size: int, folder: Path, *args, timeout: float = 180, collective_timeout: float = 1800) -> list:
    """``worker(*args)`` in ``size`` processes; returns each rank's (JSON) result. A rank that raises (a collective
    waiting longer than ``collective_timeout`` seconds raises), or a run past ``timeout`` seconds (a rank left waiting
    in a collective), fails the test."""
    folder.mkdir(parents=True, exist_ok=True)
    context = mp.start_processes(_entry, args=(size, str(folder), collective_timeout, worker, args), nprocs=size,
                                 join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            raise AssertionError(f"{size} ranks still running after {timeout} s: a rank waits in a collective")
    return [json.loads(Path(folder, f"rank{rank}.json").read_text()) for rank in range(size)]
