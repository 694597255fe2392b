import subprocess
import sys
from datetime import timedelta

import pytest

from diffsynth.training.startup.accelerator import exit_process, process_group_handler

# A process in a one-rank gloo group that buffers output, registers an exit handler and ends through exit_process.
GROUP_MEMBER = """
import atexit, os, sys
import torch.distributed as dist
from diffsynth.training.startup.accelerator import destroy_process_group_at_exit, exit_process
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
atexit.register(lambda: os.write(2, f"group alive in the user's handler: {dist.is_initialized()}\\n".encode()))
atexit.register(destroy_process_group_at_exit)  # as make_accelerator registers it, after the user's
print("buffered line", end="")
exit_process(7)
"""


def test_a_group_member_runs_its_exit_handlers_flushes_and_leaves_with_the_code(tmp_path):
    done = subprocess.run([sys.executable, "-c", GROUP_MEMBER, str(tmp_path / "store")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 7, done.stderr[-2000:]
    assert done.stdout == "buffered line"
    assert "group alive in the user's handler: False" in done.stderr


def test_a_single_process_exits_as_sys_exit_does():
    with pytest.raises(SystemExit) as exited:
        exit_process(3)
    assert exited.value.code == 3


@pytest.mark.parametrize("seconds", [90, 600, 1800])
def test_the_process_group_gets_the_timeout_asked_for_even_accelerates_default(seconds):
    passed = process_group_handler(timedelta(seconds=seconds)).to_kwargs()["timeout"]
    assert abs(passed.total_seconds() - seconds) < 1e-3
