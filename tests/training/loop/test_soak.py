"""Host memory stays flat step after step on two processes (the soak of ``scripts/bench_soak.py``, shortened).

Two gloo processes with ``--enable_model_cpu_offload`` used to grow about 5 MB per optimizer step each (the offload
manager on ``cpu:0`` never got its device buffers back); a week-long run meets the OOM killer that way. The bound is
a twentieth of that growth and several times the fitting noise of 75 steps (1000 steps measure 0.003 MB per step).
"""

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
STEPS, WARMUP, BOUND_MB_PER_STEP = 100, 25, 0.25


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_soak", REPO / "scripts" / "bench_soak.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.slow
def test_two_offloaded_processes_keep_their_memory_flat_over_a_hundred_steps(dataset, tmp_path, tiny_root):
    bench = load_bench()
    ranks = bench.soak(2, STEPS, dataset, tiny_root, tmp_path, [], None, max_pixels=4096)
    for rank, figures in enumerate(ranks):
        settled = [(step, rss, pss) for step, rss, pss in figures["samples"] if step > WARMUP]
        assert len(settled) == STEPS - WARMUP
        rss_slope = bench.slope_per_step([(step, rss) for step, rss, _ in settled]) / bench.MB
        pss_slope = bench.slope_per_step([(step, pss) for step, _, pss in settled]) / bench.MB
        assert rss_slope < BOUND_MB_PER_STEP and pss_slope < BOUND_MB_PER_STEP, (rank, rss_slope, pss_slope)
