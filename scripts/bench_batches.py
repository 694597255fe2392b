"""Training throughput at several batch sizes on the tiny models: samples per second, one-stage and from a cache.

    python scripts/bench_batches.py                          # tiny Qwen-Image, batch 1, 2, 4: a few minutes on a CPU
    python scripts/bench_batches.py --models qwen,wan --batch_sizes 1,2,4,8

Everything runs the real trainer in-process (``bench_split.run_trainer``) on the tiny random-weight repos and drawn
example datasets built in a temporary folder, every sample of one size (``--height``/``--width``, so every batch is
full). For each model and batch size it trains one-stage (``--task sft``) and from a stage-1 cache (``--task
sft:train``, made once per model), and prints the samples per second of the training loop.

How it is timed: ``training_loop.sample_generators`` is called once per micro-batch, when its samples have been read and
before their forward pass; the script wraps it (a monkeypatch of the module global the loop looks up) to stamp
``time.perf_counter()`` and the batch's size. The interval between two stamps is one batch's forward, backward,
optimizer step and logging plus reading the next batch; samples per second are the samples of the timed batches over
the sum of their intervals, the first ``--warmup`` batches of every run left out. Runs alternate between the batch
sizes over ``--rounds`` so that drifting load on a shared machine hits all alike.

Read the figures with the model in mind: the tiny transformers are so small that a step's time is mostly fixed
per-step costs (Python, optimizer, logging) and per-sample unit work (the VAE encode in one-stage training), which a
batch shares out; on a real model and a GPU a batch gains by filling the device, up to its memory.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from bench_split import run_trainer

from diffsynth.core.data.example_dataset import build_example_dataset, build_example_video_dataset
from diffsynth.testing.tiny_models import (
    QWEN_IMAGE_MODEL_ID,
    QWEN_IMAGE_PATTERNS,
    WAN_MODEL_ID,
    WAN_PATTERNS,
    build_tiny_models,
)

MODELS = {
    "qwen": (QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS, "to_q,to_k,to_v,to_out.0", False),
    "wan": (WAN_MODEL_ID, WAN_PATTERNS, "q,k,v,o", True),
}


class BatchClock:
    """Stamps every call of ``training_loop.sample_generators`` with the time and the batch's size."""

    def __init__(self) -> None:
        import diffsynth.training.loop.training_loop as runner

        self.stamps: list[tuple[float, int]] = []
        self._runner, self._original = runner, runner.sample_generators

        def stamped(seed: int, batch_number: int, batch_size: int, count: int) -> list[torch.Generator]:
            self.stamps.append((time.perf_counter(), count))
            return self._original(seed, batch_number, batch_size, count)

        runner.sample_generators = stamped

    def take(self, warmup: int) -> tuple[int, float]:
        """``(samples, seconds)`` of the last run's timed batches; clears the stamps."""
        stamps, self.stamps = self.stamps, []
        pairs = list(zip(stamps, stamps[1:]))[warmup:]
        return sum(count for (_, count), _ in pairs), sum(after[0] - before[0] for before, after in pairs)

    def restore(self) -> None:
        self._runner.sample_generators = self._original


def model_flags(name: str, args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The model and size flags of one tiny model, and its entries by component."""
    model_id, patterns, targets, video = MODELS[name]
    entries = {part: f"{model_id}:{patterns[part]}" for part in ("dit", "text_encoder", "vae")}
    flags = ["--model_id_with_origin_paths", ",".join(entries.values()), "--lora_base_model", "dit",
             "--lora_target_modules", targets, "--lora_rank", "8", "--torch_dtype", "float32", "--seed", "0",
             "--height", str(args.size), "--width", str(args.size), "--num_epochs", "1"]
    return flags + (["--num_frames", "5"] if video else []), entries


def bench_model(name: str, work: Path, args: argparse.Namespace, clock: BatchClock) -> dict[tuple[str, int], Any]:
    """Samples per second of one model at every batch size, one-stage and from a cache."""
    from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
    from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline

    video = MODELS[name][3]
    pipeline = WanVideoPipeline if video else QwenImagePipeline
    data = work / f"data_{name}"
    metadata = (build_example_video_dataset(data, num_videos=args.num_samples, num_frames=6) if video
                else build_example_dataset(data, num_images=args.num_samples))
    flags, entries = model_flags(name, args)
    raw = ["--dataset_base_path", str(data), "--dataset_metadata_path", str(metadata)]
    cache = work / f"cache_{name}"
    run_trainer([*flags, *raw, "--task", "sft:data_process", "--offload_models", entries["dit"], "--output_path",
                 str(cache)], args.verbose, pipeline, video)
    argvs = {"one-stage": [*flags, *raw],
             "stage 2": [*flags, "--task", "sft:train", "--dataset_base_path", str(cache), "--offload_models",
                         f"{entries['text_encoder']},{entries['vae']}"]}
    totals: dict[tuple[str, int], list[float]] = {}
    for round_index in range(args.rounds):
        sizes = args.batch_sizes if round_index % 2 == 0 else args.batch_sizes[::-1]
        for mode, argv in argvs.items():
            for size in sizes:
                output = work / f"{name}_{mode.replace(' ', '_')}_{size}_{round_index}"
                run_trainer([*argv, "--batch_size", str(size), "--dataset_repeat", str(args.dataset_repeat),
                             "--output_path", str(output)], args.verbose, pipeline, video)
                samples, seconds = clock.take(args.warmup)
                total = totals.setdefault((mode, size), [0, 0.0])
                total[0] += samples
                total[1] += seconds
                print(f"[{name}] {mode}, batch {size}: {samples} samples timed in {seconds:.2f} s", file=sys.stderr)
    return {key: samples / seconds for key, (samples, seconds) in totals.items() if seconds > 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="qwen", help="comma list of: qwen, wan")
    parser.add_argument("--batch_sizes", default="1,2,4", help="comma list of batch sizes")
    parser.add_argument("--num_samples", type=int, default=8, help="images (or clips) in the example dataset")
    parser.add_argument("--dataset_repeat", type=int, default=4, help="--dataset_repeat of the training runs")
    parser.add_argument("--size", type=int, default=128, help="--height and --width of every sample")
    parser.add_argument("--rounds", type=int, default=2, help="runs per batch size and mode (order alternating)")
    parser.add_argument("--warmup", type=int, default=2, help="batches left out at the start of every run")
    parser.add_argument("--num_threads", type=int, help="torch.set_num_threads (default: 1 without CUDA)")
    parser.add_argument("--verbose", action="store_true", help="show the trainer's logs and progress bars")
    args = parser.parse_args()
    models = [name.strip() for name in args.models.split(",") if name.strip()]
    args.batch_sizes = [int(size) for size in args.batch_sizes.split(",") if size.strip()]
    if not models or set(models) - set(MODELS) or not args.batch_sizes or min(args.batch_sizes) < 1:
        parser.error(f"--models {args.models!r} (choose from {', '.join(MODELS)}) and --batch_sizes "
                     f"{args.batch_sizes!r} (positive integers) are needed")
    torch.set_num_threads(args.num_threads or (torch.get_num_threads() if torch.cuda.is_available() else 1))
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_batches_")))
        os.environ["DIFFSYNTH_MODEL_BASE_PATH"] = str(work / "models")
        build_tiny_models(work / "models", only=("qwen_image", "wan"))
        clock = BatchClock()
        stack.callback(clock.restore)
        results = {name: bench_model(name, work, args, clock) for name in models}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"tiny models, {args.size}x{args.size} samples, {torch.get_num_threads()} torch threads, device: {device}")
    print(f"{'model':>5} | {'mode':>9} | {'batch':>5} | {'samples/s':>9} | {'vs batch 1':>10}")
    for name, figures in results.items():
        for mode in ("one-stage", "stage 2"):
            base = figures.get((mode, 1))
            for size in args.batch_sizes:
                rate = figures.get((mode, size))
                if rate is None:
                    continue
                ratio = f"{rate / base:9.2f}x" if base else "         -"
                print(f"{name:>5} | {mode:>9} | {size:>5} | {rate:9.1f} | {ratio}")
    print("command:", " ".join(shlex.quote(arg) for arg in [sys.executable, *sys.argv]))


if __name__ == "__main__":
    main()
