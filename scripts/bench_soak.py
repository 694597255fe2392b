"""Host memory over long runs: does a process's memory stay flat step after step, or grow until the OOM killer comes?

    python scripts/bench_soak.py                                  # 2 processes, 1000 steps, --enable_model_cpu_offload
    python scripts/bench_soak.py --processes 1 --steps 300
    python scripts/bench_soak.py --steps 200 --diagnose 100,200   # what Python keeps between steps 100 and 200
    python scripts/bench_soak.py --stage_one 50,200,800           # stage 1's peak RSS per number of images

Training (the default): trains a LoRA of the tiny Qwen-Image under ``torchrun`` (on the CPU: gloo) for ``--steps``
optimizer steps at one sample per step, and every process reads its resident set size (RSS, ``VmRSS`` of
``/proc/self/status``) and proportional set size (PSS, ``/proc/self/smaps_rollup``) after each optimizer step. Printed
per process: RSS and PSS after the warm-up and at the end, and the slope of each, MB per step, fitted by least squares
over the steps after the warm-up (the first ``--warmup`` steps: the allocator and the caches settle there). A process
that keeps something per step shows a slope of its size; a flat one a slope near zero. ``--diagnose A,B`` also counts
Python objects by type (``gc.get_objects``), tensors among them, and the lines that allocated what is still alive
(``tracemalloc``, started at step A) between steps A and B, on every process, and prints the largest growths.

Stage 1 (``--stage_one``): caches ``sft:data_process`` of an example dataset of each given size, on one process,
and prints the peak RSS (``VmHWM``) of each run, then of a rerun over the complete cache, which computes nothing.
Something kept per computed sample makes the peak grow with the number of images; the rerun's is the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MB = 1000 * 1000
MIB = 1024 * 1024


# ---- one rank ------------------------------------------------------------------------------------------------------

def _status_bytes(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``), in bytes."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(f"{field}:"))


def _object_counts() -> dict[str, int]:
    import gc

    import torch

    gc.collect()
    counts: dict[str, int] = {}
    for thing in gc.get_objects():
        name = type(thing).__qualname__
        counts[name] = counts.get(name, 0) + 1
    counts["<torch.Tensor>"] = sum(1 for thing in gc.get_objects() if isinstance(thing, torch.Tensor))
    return counts


def _growth(before: dict[str, int], after: dict[str, int], top: int = 15) -> list[tuple[str, int]]:
    grown = [(name, after[name] - before.get(name, 0)) for name in after if after[name] > before.get(name, 0)]
    return sorted(grown, key=lambda item: -item[1])[:top]


def run_rank(argv: list[str], report: Path, diagnose: tuple[int, int] | None) -> None:
    """Trains with ``argv`` in this (launched) process, reading its RSS and PSS after every optimizer step, and
    writes them (and the diagnosis) to ``report.<rank>``."""
    import tracemalloc

    import torch.distributed as dist

    from diffsynth.core.shared_weights.pss import process_pss
    from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
    from diffsynth.training.entry import main
    from diffsynth.training.outputs.logger import ModelLogger

    samples: list[tuple[int, int, int]] = []
    diagnosis: dict[str, object] = {}
    on_step_end = ModelLogger.on_step_end

    def sample_memory(logger, step, *args, **kwargs):
        written = on_step_end(logger, step, *args, **kwargs)
        samples.append((step, _status_bytes("VmRSS"), process_pss()))
        if diagnose is not None and step == diagnose[0]:
            diagnosis["counts"] = _object_counts()
            tracemalloc.start(8)
        elif diagnose is not None and step == diagnose[1]:
            diagnosis["objects"] = _growth(diagnosis.pop("counts"), _object_counts())  # before the snapshot's own
            snapshot = tracemalloc.take_snapshot()
            tracemalloc.stop()
            diagnosis["lines"] = [(" <- ".join(f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"
                                               for frame in reversed(stat.traceback[-4:])), stat.size, stat.count)
                                  for stat in snapshot.statistics("traceback")[:8]]
        return written

    ModelLogger.on_step_end = sample_memory
    main(QwenImagePipeline, argv)
    Path(f"{report}.{dist.get_rank()}").write_text(json.dumps({"samples": samples, "diagnosis": diagnosis}))


def slope_per_step(points: list[tuple[int, int]]) -> float:
    """Least-squares slope of ``(step, bytes)`` points, in bytes per step."""
    count = len(points)
    mean_step = sum(step for step, _ in points) / count
    mean_value = sum(value for _, value in points) / count
    spread = sum((step - mean_step) ** 2 for step, _ in points)
    return sum((step - mean_step) * (value - mean_value) for step, value in points) / spread


# ---- the benchmark -------------------------------------------------------------------------------------------------

def model_flags(max_pixels: int) -> list[str]:
    from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS

    models = ",".join(f"{QWEN_IMAGE_MODEL_ID}:{QWEN_IMAGE_PATTERNS[name]}" for name in ("dit", "text_encoder", "vae"))
    return ["--model_id_with_origin_paths", models, "--lora_base_model", "dit", "--lora_target_modules",
            "to_q,to_k,to_v", "--lora_rank", "4", "--torch_dtype", "float32", "--max_pixels", str(max_pixels),
            "--seed", "0"]


def environment(root: Path) -> dict[str, str]:
    return {**os.environ, "DIFFSYNTH_MODEL_BASE_PATH": str(root), "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def soak(processes: int, steps: int, data: Path, root: Path, scratch: Path, extra: list[str],
         diagnose: str | None, max_pixels: int) -> list[dict]:
    """Runs the training soak and returns each rank's report."""
    report = scratch / f"soak-{processes}"
    flags = [*model_flags(max_pixels), "--dataset_base_path", str(data), "--dataset_metadata_path",
             str(data / "metadata.csv"), "--dataset_repeat", str(steps * processes), "--max_train_steps", str(steps), "--output_path",
             str(scratch / f"out-{processes}"), "--enable_model_cpu_offload", *extra]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
               str(Path(__file__).resolve()), "--worker", str(report), diagnose or "-", *flags]
    done = subprocess.run(command, env=environment(root), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the {processes}-process run failed:\n{done.stderr[-4000:]}")
    return [json.loads(Path(f"{report}.{rank}").read_text()) for rank in range(processes)]


def print_soak(ranks: list[dict], warmup: int, processes: int, steps: int) -> list[float]:
    """Prints each rank's figures; returns each rank's RSS slope in MB per step."""
    print(f"{processes} process(es), {steps} optimizer steps, tiny Qwen-Image, --enable_model_cpu_offload; slopes "
          f"fitted over steps {warmup + 1}-{steps}\n")
    print(f"| rank | RSS at step {warmup}, MB | RSS at the end, MB | RSS slope, MB/step | PSS at step {warmup}, MB | "
          "PSS at the end, MB | PSS slope, MB/step |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    slopes = []
    for rank, figures in enumerate(ranks):
        settled = [(step, rss, pss) for step, rss, pss in figures["samples"] if step > warmup]
        rss_slope = slope_per_step([(step, rss) for step, rss, _ in settled]) / MB
        pss_slope = slope_per_step([(step, pss) for step, _, pss in settled]) / MB
        slopes.append(rss_slope)
        first, last = settled[0], settled[-1]
        print(f"| {rank} | {first[1] / MB:.0f} | {last[1] / MB:.0f} | {rss_slope:.4f} | {first[2] / MB:.0f} | "
              f"{last[2] / MB:.0f} | {pss_slope:.4f} |")
        diagnosis = figures["diagnosis"]
        if diagnosis:
            print(f"\nrank {rank}, Python objects grown: {diagnosis['objects']}")
            for where, size, count in diagnosis["lines"]:
                print(f"  {size / 1024:.0f} KiB in {count} blocks allocated at {where}")
            print()
    return slopes


def stage_one_peak(data: Path, root: Path, cache: Path, max_pixels: int) -> int:
    """Peak RSS of one stage-1 run over ``data`` into ``cache``."""
    from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS

    code = ("import sys\nfrom diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline\n"
            "from diffsynth.training.entry import main\nmain(QwenImagePipeline, sys.argv[1:])\n"
            "print('PEAK', next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmHWM')))")
    flags = [*model_flags(max_pixels), "--dataset_base_path", str(data), "--dataset_metadata_path",
             str(data / "metadata.csv"), "--task", "sft:data_process", "--offload_models", f"{QWEN_IMAGE_MODEL_ID}:{QWEN_IMAGE_PATTERNS['dit']}",
             "--output_path", str(cache)]
    done = subprocess.run([sys.executable, "-c", code, *flags], env=environment(root), capture_output=True, check=False,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"stage 1 failed:\n{done.stderr[-4000:]}")
    return int(done.stdout.split("PEAK")[-1].split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2, help="Processes of the training soak.")
    parser.add_argument("--steps", type=int, default=1000, help="Optimizer steps of the training soak.")
    parser.add_argument("--warmup", type=int, default=50, help="Steps left out of the slope (the allocator settles).")
    parser.add_argument("--diagnose", help="A,B: Python objects and allocations kept between steps A and B.")
    parser.add_argument("--stage_one", help="Image counts, comma-separated: stage 1's peak RSS for each instead.")
    parser.add_argument("--max_pixels", type=int,
                        help="--max_pixels of the runs (default: 4096 for training, 65536 for stage 1, where the "
                             "example images keep sizes of their own)")
    parser.add_argument("flags", nargs="*", help="More trainer flags after --, e.g. -- --shared_host_weights off.")
    args = parser.parse_args()
    args.max_pixels = args.max_pixels or (65536 if args.stage_one else 4096)
    from diffsynth.core.data.example_dataset import build_example_dataset
    from diffsynth.testing.tiny_models import build_tiny_qwen_image

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "models"
        build_tiny_qwen_image(root)
        if args.stage_one:
            print("| images | stage-1 peak RSS, MiB | rerun over the complete cache, MiB |\n| ---: | ---: | ---: |")
            for count in [int(count) for count in args.stage_one.split(",")]:
                data, cache = Path(scratch) / f"data-{count}", Path(scratch) / f"cache-{count}"
                build_example_dataset(data, num_images=count)
                first = stage_one_peak(data, root, cache, args.max_pixels)
                rerun = stage_one_peak(data, root, cache, args.max_pixels)
                print(f"| {count} | {first / MIB:.0f} | {rerun / MIB:.0f} |", flush=True)
            return
        data = Path(scratch) / "data"
        build_example_dataset(data, num_images=4)
        ranks = soak(args.processes, args.steps, data, root, Path(scratch), args.flags, args.diagnose,
                     args.max_pixels)
        slopes = print_soak(ranks, args.warmup, args.processes, args.steps)
        print(f"largest RSS slope: {max(slopes):.4f} MB per step")


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "--worker":
        window = None if sys.argv[3] == "-" else tuple(int(step) for step in sys.argv[3].split(","))
        run_rank(sys.argv[4:], Path(sys.argv[2]), window)
    else:
        main()
