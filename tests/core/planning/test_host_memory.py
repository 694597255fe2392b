"""Host memory predicted for building each policy's masters, against the process's resident memory.

Each case runs in a fresh process (so nothing else moves its resident memory) on a model of 48 MB tensors (above
glibc's largest mmap threshold, so a freed tensor leaves resident memory at once): resident memory is read before the
model is built, then the peak and the final value once the policy has built its masters. The planner predicts both
from the tensor sizes alone; they must agree within 15%.
"""

import json
import subprocess
import sys
import textwrap

import pytest

from diffsynth.core.planning.residency import build_peak, classic_swap_residency, leaf_offload_residency

SCRIPT = textwrap.dedent("""
    import json, sys, torch
    from torch import nn
    from diffsynth.core.offload_training import BlockSwapConfig, OffloadTrainingManager, create_offloader

    def rss(field):
        for line in open("/proc/self/status"):
            if line.startswith(field):
                return int(line.split()[1]) * 1024

    torch.set_num_threads(1)
    before = rss("VmRSS")
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # restarts the peak (VmHWM) from here
    model = nn.Module()
    model.blocks = nn.ModuleList(nn.Linear(4096, 6144, bias=False, dtype=torch.bfloat16) for _ in range(6))
    model.requires_grad_(False)
    loaded = rss("VmRSS") - before
    if sys.argv[1] == "offload":
        policy = OffloadTrainingManager(model, "cpu")
    else:
        policy = create_offloader(model.blocks, BlockSwapConfig(int(sys.argv[1])), "cpu")
    print(json.dumps({"loaded": loaded, "peak": rss("VmHWM") - before, "final": rss("VmRSS") - before}))
""")


def measure(policy: str) -> dict:
    done = subprocess.run([sys.executable, "-c", SCRIPT, policy], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def meta_model():
    import torch
    from torch import nn

    with torch.device("meta"):
        model = nn.Module()
        model.blocks = nn.ModuleList(nn.Linear(4096, 6144, bias=False, dtype=torch.bfloat16) for _ in range(6))
    return model.requires_grad_(False)


MODEL_BYTES = 6 * 4096 * 6144 * 2


def within(measured: int, predicted: int, share: float = 0.15) -> bool:
    return abs(measured - predicted) <= share * predicted


@pytest.mark.parametrize("swapped", [2, 6])
def test_classic_block_swap_host_memory(swapped):
    measured = measure(str(swapped))
    sizes = [[4096 * 6144 * 2] for _ in range(6)]
    predicted = classic_swap_residency(sizes, swapped, checkpointing=True, pinned=False, loaded_bytes=MODEL_BYTES)
    assert within(measured["loaded"], MODEL_BYTES)
    assert within(measured["peak"], predicted.build_peak_bytes)
    # The blocks kept on the device stay where they are (the device is the host here), the swapped ones in the arena.
    assert within(measured["final"], MODEL_BYTES - predicted.offloaded_bytes + predicted.host_bytes)


def test_leaf_offload_host_memory():
    import torch

    measured = measure("offload")
    model = meta_model()
    x = torch.empty(2, 4096, dtype=torch.bfloat16, device="meta", requires_grad=True)
    predicted = leaf_offload_residency(model, lambda: sum(block(x).float().sum() for block in model.blocks),
                                       pinned=False)
    assert within(measured["peak"], predicted.build_peak_bytes)
    assert within(measured["final"], predicted.host_bytes)


def test_a_pinned_arena_counts_whole_chunks_while_the_loaded_model_is_still_there():
    sizes = [3 << 20] * 5 + [1 << 20]
    pageable = build_peak(sizes, loaded_bytes=sum(sizes), pinned=False)
    pinned = build_peak(sizes, loaded_bytes=sum(sizes), pinned=True)
    assert sum(sizes) < pageable <= sum(sizes) + (3 << 20) + 64
    assert pinned >= sum(sizes) + (16 << 20) - (3 << 20)  # the first 16 MiB chunk opens beside the loaded model
