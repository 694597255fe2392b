"""Split training (stage-1 cache, then stage-2 training) against one-stage training, measured in one run.

    python scripts/bench_split.py                       # tiny Qwen-Image, example dataset, CPU: about a minute
    python scripts/bench_split.py --modes plain,offload # also the same runs with --enable_model_cpu_offload

Everything runs the real trainer in-process (``diffsynth.training.entry.main(QwenImagePipeline, argv)``) on the
tiny random-weight Qwen-Image repo and the drawn example dataset, both built in a temporary folder, with the flags
printed at the end. For each of ``--modes`` (plain, and offload: ``--enable_model_cpu_offload``) it measures:

- stage 1 (``--task sft:data_process``, the transformer given as a weightless skeleton by ``--offload_models``): the
  wall time of the whole ``main`` call (model loading included) and the time of the caching loop per sample;
- the cache size per sample: the bytes of ``<cache>/<process>/<index>.safetensors`` over the samples cached;
- the median optimizer-step time of stage 2 (``--task sft:train`` from that cache, the text encoder and the VAE as
  skeletons) and of one-stage training (``--task sft``), with identical flags, seed and ``--dataset_repeat``, and
  their ratio (stage 2 / one-stage). Both see the same samples in the same order with the same noise, so their losses
  agree; the largest difference is printed as a check that the two compute the same thing.

How step times are taken: ``training_loop.step_generator`` is called once per micro-batch, at the start of its
forward pass, after the loader has produced the sample. This script wraps it (a monkeypatch of the module global
the training loop looks up, so nothing in the trainer changes) to record ``time.perf_counter()``, and a step's time
is the difference between consecutive calls: loss, backward, optimizer step, logging, then fetching the next sample
(decoding an image for one-stage training, reading a cache file for stage 2). The last step of a run has no
following call and is not counted (it would include the end-of-epoch LoRA save), and the first ``--warmup``
differences of every run are dropped. The loop reads the loss with ``.item()`` every step, so on a GPU the stamps are
synchronised with the device. Process-CPU time is stamped alongside: on a machine shared with other jobs, the
ratio of median CPU time per step is a cross-check on the wall-time ratio. Without CUDA the script runs torch on one
thread unless ``--num_threads`` says otherwise: the tiny model's operations are too small to gain from a second
thread (the stage-2 step is the same), and with two threads on two cores every operation waits at a barrier
whenever another job holds a core, which made stage-2 steps 30x slower (CPU time included, as the waiting threads
spin) while other jobs ran; on one thread the figures barely move under load. With
``--gradient_accumulation_steps`` in ``--extra_flags`` the times are per micro-batch; the stamps are per sample, so
batches (``--batch_size``) are timed by ``scripts/bench_batches.py`` instead. Stage-2 and one-stage runs
alternate (ABBA over ``--rounds``) so that drifting load on a shared machine hits both alike; the step times of all
rounds are pooled before the median, and their quartiles are printed to show the spread.

Read the ratio with the model in mind. The tiny model's text encoder (2 layers, width 32) costs almost nothing, but
its VAE, narrow as it is, encodes the image at full resolution with 3-D convolutions, which are slow on the CPU: at
the default ``--max_pixels 65536`` one encode takes up to a few tenths of a second on one thread, several
times the tiny transformer's forward and backward on the 8x8-downsampled latent, so on the CPU stage 2 saves most of
a one-stage step (less at a smaller ``--max_pixels``). The figures say how the trainer's stages behave, not what the
real model gains. On the real Qwen-Image on a GPU it is the text encoder (Qwen2.5-VL, 7B) and the VAE encode of a
megapixel image that dominate the stage-1 work of a one-stage step, more so when they are streamed from host memory
under offload; stage 2 skips both, and the 20B transformer's forward and backward is what is left. "Break-even" is
how many passes over the data make stage 1 pay for itself: stage-1 time per sample / (one-stage step - stage-2 step).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from diffsynth.core.data.example_dataset import build_example_dataset
from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS, build_tiny_qwen_image

PATTERN = {name: f"{QWEN_IMAGE_MODEL_ID}:{QWEN_IMAGE_PATTERNS[name]}" for name in ("dit", "text_encoder", "vae")}
LORA_TARGETS = "to_q,to_k,to_v,add_q_proj,add_k_proj,add_v_proj,to_out.0,to_add_out"


class StepClock:
    """Stamps every call of ``training_loop.step_generator`` and every stage-1 loop, without changing what they do."""

    def __init__(self) -> None:
        import diffsynth.training.entry as trainer
        import diffsynth.training.loop.training_loop as runner

        self.stamps: list[tuple[float, float]] = []
        self.loop_seconds: list[float] = []
        self._runner, self._trainer = runner, trainer
        self._step_generator = runner.step_generator
        self._data_process = trainer.launch_data_process_task

        def stamped_step_generator(*args: Any, **kwargs: Any) -> torch.Generator:
            self.stamps.append((time.perf_counter(), time.process_time()))
            return self._step_generator(*args, **kwargs)

        def timed_data_process(*args: Any, **kwargs: Any) -> int:
            started = time.perf_counter()
            result = self._data_process(*args, **kwargs)
            self.loop_seconds.append(time.perf_counter() - started)
            return result

        runner.step_generator = stamped_step_generator
        trainer.launch_data_process_task = timed_data_process

    def step_times(self, warmup: int) -> tuple[list[float], list[float]]:
        """Wall and process-CPU seconds between consecutive stamps of the last run, the first ``warmup`` dropped.

        Clears the stamps. CPU time counts every thread of this process, so it is not a step time; it serves as a
        cross-check that other processes competing for the cores do not move.
        """
        stamps, self.stamps = self.stamps, []
        pairs = list(zip(stamps, stamps[1:]))[warmup:]
        return [b[0] - a[0] for a, b in pairs], [b[1] - a[1] for a, b in pairs]

    def restore(self) -> None:
        self._runner.step_generator = self._step_generator
        self._trainer.launch_data_process_task = self._data_process


def run_trainer(argv: Sequence[str], verbose: bool, pipeline_class: type | None = None,
                video: bool = False) -> tuple[dict, float]:
    """One ``trainer.main`` call as a fresh launch would make it (``QwenImagePipeline`` unless ``pipeline_class``;
    ``video`` for a video trainer's flags); returns its result and wall time.

    Every call builds its own ``accelerate.Accelerator``; accelerate keeps its state in process-wide singletons, so
    they are reset afterwards, as the trainer tests do. Progress bars and prints are swallowed unless ``verbose``
    (and shown when the run fails).
    """
    from accelerate.state import AcceleratorState, GradientState

    from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
    from diffsynth.training.entry import main

    captured = io.StringIO()
    started = time.perf_counter()
    try:
        with contextlib.ExitStack() as quiet:
            if not verbose:
                quiet.enter_context(contextlib.redirect_stdout(captured))
                quiet.enter_context(contextlib.redirect_stderr(captured))
            result = main(pipeline_class or QwenImagePipeline, list(argv), video=video)
    except BaseException:
        sys.stderr.write(captured.getvalue())
        raise
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
    return result, time.perf_counter() - started


def cache_bytes(cache: Path) -> int:
    """Bytes of the per-sample cache files ``<cache>/<process>/<index>.safetensors`` (not ``cache_info.json``)."""
    return sum(path.stat().st_size for path in cache.glob("*/*.safetensors"))


def alternate(rounds: int) -> list[str]:
    """ABBA order of the stage-2 and one-stage runs, so a linear drift in machine load hits both alike."""
    order: list[str] = []
    for index in range(rounds):
        order += ["stage2", "one_stage"] if index % 2 == 0 else ["one_stage", "stage2"]
    return order


def bench_mode(name: str, offload: bool, common: list[str], raw: list[str], work: Path, args: argparse.Namespace,
               clock: StepClock, log: Callable[[str], None]) -> dict[str, Any]:
    """Stage 1 once, then ``--rounds`` pairs of stage-2 and one-stage runs, for one placement mode."""
    mode_flags = ["--enable_model_cpu_offload"] if offload else []
    cache = work / f"cache_{name}"
    stage1 = [*common, *raw, *mode_flags, "--task", "sft:data_process", "--dataset_repeat", "1",
              "--offload_models", PATTERN["dit"], "--output_path", str(cache)]
    result, stage1_wall = run_trainer(stage1, args.verbose)
    samples = result["cached"]
    stage1_loop = clock.loop_seconds.pop()
    log(f"[{name}] stage 1: {samples} samples cached in {stage1_wall:.1f} s")
    train_flags = [*common, *mode_flags, "--dataset_repeat", str(args.dataset_repeat)]
    argvs = {
        "stage2": [*train_flags, "--task", "sft:train", "--dataset_base_path", str(cache),
                   "--offload_models", f"{PATTERN['text_encoder']},{PATTERN['vae']}"],
        "one_stage": [*train_flags, *raw, "--task", "sft"],
    }  # fmt: skip
    times: dict[str, list[float]] = {"stage2": [], "one_stage": []}
    cpu: dict[str, list[float]] = {"stage2": [], "one_stage": []}
    losses: dict[str, list[float]] = {}
    for index, kind in enumerate(alternate(args.rounds)):
        output = ["--output_path", str(work / f"{name}_{kind}_{index}")]
        result, wall = run_trainer([*argvs[kind], *output], args.verbose)
        measured, cpu_measured = clock.step_times(args.warmup)
        times[kind] += measured
        cpu[kind] += cpu_measured
        losses[kind] = result["losses"]
        log(f"[{name}] {kind}: {result['global_step']} steps in {wall:.1f} s, {len(measured)} timed")
    if not times["stage2"] or not times["one_stage"]:
        raise SystemExit(f"no step was timed: raise --num_images or --dataset_repeat above --warmup {args.warmup} + 1")
    stage2, one = statistics.median(times["stage2"]), statistics.median(times["one_stage"])
    loss_gap = max(abs(a - b) for a, b in zip(losses["stage2"], losses["one_stage"]))
    return {
        "stage1_wall": stage1_wall, "stage1_per_sample": stage1_loop / samples, "samples": samples,
        "cache_per_sample": cache_bytes(cache) / samples, "stage2_step": stage2, "one_stage_step": one,
        "timed": (len(times["stage2"]), len(times["one_stage"])), "loss_gap": loss_gap,
        "stage2_times": times["stage2"], "one_stage_times": times["one_stage"],
        "cpu_ratio": statistics.median(cpu["stage2"]) / statistics.median(cpu["one_stage"]),
        "argv": {"stage1": stage1, **argvs},
    }  # fmt: skip


def quartiles(times: Sequence[float]) -> str:
    """The 25th, 50th and 75th percentiles in milliseconds: how noisy the median is."""
    if len(times) < 2:
        return " / ".join([f"{times[0] * 1e3:.0f}"] * 3)
    low, mid, high = statistics.quantiles(times, n=4)
    return f"{low * 1e3:.0f} / {mid * 1e3:.0f} / {high * 1e3:.0f}"


def flags_line(argv: Sequence[str], work: Path) -> str:
    """A trainer command line with the temporary folder shown as ``<tmp>``."""
    return " ".join(shlex.quote(arg) for arg in argv).replace(str(work), "<tmp>")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num_images", type=int, default=4, help="images in the example dataset (= samples cached)")
    parser.add_argument("--dataset_repeat", type=int, default=6,
                        help="--dataset_repeat of the training runs: steps per run = num_images x this")
    parser.add_argument("--max_pixels", type=int, default=65536, help="--max_pixels of every run")
    parser.add_argument("--lora_rank", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="stage-2 / one-stage run pairs per mode (ABBA order)")
    parser.add_argument("--warmup", type=int, default=2, help="step times dropped at the start of every run")
    parser.add_argument("--modes", default="plain", help="comma list of: plain (models on the device), offload "
                        "(--enable_model_cpu_offload)")
    parser.add_argument("--extra_flags", default="", help="more trainer flags for every run, given with '=': "
                        "--extra_flags='--use_gradient_checkpointing'")
    parser.add_argument("--num_threads", type=int,
                        help="torch.set_num_threads (default: 1 without CUDA, see above; torch's choice with CUDA)")
    parser.add_argument("--keep", help="work in this new or empty folder and keep it (default: a temporary folder, "
                        "deleted)")
    parser.add_argument("--verbose", action="store_true", help="show the trainer's logs and progress bars")
    args = parser.parse_args()
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    unknown = sorted(set(modes) - {"plain", "offload"})
    if unknown or not modes:
        parser.error(f"--modes {args.modes!r}: choose from plain, offload (e.g. --modes plain,offload)")
    for flag in ("num_images", "dataset_repeat", "rounds"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} {getattr(args, flag)} must be at least 1")
    if args.warmup < 0:
        parser.error(f"--warmup {args.warmup} must be 0 or more")
    if args.num_threads is None and not torch.cuda.is_available():
        args.num_threads = 1
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    # Set before the trainer's own basicConfig, which then leaves it alone: warnings only, unless --verbose.
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    with contextlib.ExitStack() as stack:
        if args.keep:
            work = Path(args.keep).resolve()
            if work.exists() and any(work.iterdir()):
                # A reused cache would be skipped by stage 1 and a reused output folder would mix runs.
                raise SystemExit(f"--keep {args.keep}: the folder is not empty; pass a new or empty folder")
            work.mkdir(parents=True, exist_ok=True)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_split_")))
        os.environ["DIFFSYNTH_MODEL_BASE_PATH"] = str(work / "models")
        build_tiny_qwen_image(work / "models")
        metadata = build_example_dataset(work / "data", num_images=args.num_images)
        common = [
            "--model_id_with_origin_paths", ",".join(PATTERN.values()), "--lora_base_model", "dit",
            "--lora_target_modules", LORA_TARGETS, "--lora_rank", str(args.lora_rank), "--torch_dtype", "float32",
            "--seed", "0", "--max_pixels", str(args.max_pixels), "--num_epochs", "1", *shlex.split(args.extra_flags),
        ]  # fmt: skip
        raw = ["--dataset_base_path", str(metadata.parent), "--dataset_metadata_path", str(metadata)]
        clock = StepClock()
        try:
            results = {name: bench_mode(name, name == "offload", common, raw, work, args, clock, log)
                       for name in modes}
        finally:
            clock.restore()

        threads = torch.get_num_threads()
        print(f"tiny Qwen-Image, {args.num_images} example images, max_pixels={args.max_pixels}, LoRA rank "
              f"{args.lora_rank}, float32, {threads} torch threads, device: "
              f"{'cuda' if torch.cuda.is_available() else 'cpu'}")
        print(f"{'mode':>7} | {'stage 1 wall':>12} | {'stage 1 /sample':>15} | {'cache /sample':>13} | "
              f"{'stage-2 step':>12} | {'one-stage step':>14} | {'ratio':>5} | {'break-even':>10} | timed (2 + 1)")
        for name, r in results.items():
            saving = r["one_stage_step"] - r["stage2_step"]
            even = f"{r['stage1_per_sample'] / saving:7.1f} ep" if saving > 0 else "     never"
            print(f"{name:>7} | {r['stage1_wall']:10.2f} s | {r['stage1_per_sample'] * 1e3:12.1f} ms | "
                  f"{r['cache_per_sample'] / 1024:9.1f} KiB | {r['stage2_step'] * 1e3:9.1f} ms | "
                  f"{r['one_stage_step'] * 1e3:11.1f} ms | {r['stage2_step'] / r['one_stage_step']:5.2f} | "
                  f"{even:>10} | {r['timed'][0]} + {r['timed'][1]}")
        for name, r in results.items():
            print(f"{name:>7} step-time quartiles (ms): stage 2 {quartiles(r['stage2_times'])}, one-stage "
                  f"{quartiles(r['one_stage_times'])}; ratio of median process-CPU time per step "
                  f"{r['cpu_ratio']:.2f}")
        print("ratio = stage-2 step / one-stage step (medians over the pooled runs); break-even = epochs after which "
              "stage 1 has paid for itself; timed = step times behind the stage-2 and one-stage medians")
        print("largest |stage-2 loss - one-stage loss| per step:",
              ", ".join(f"{name} {r['loss_gap']:.2e}" for name, r in results.items()))
        print("command:", " ".join(shlex.quote(arg) for arg in [sys.executable, *sys.argv]))
        for name, r in results.items():
            for kind, argv in r["argv"].items():
                print(f"  {name} {kind}: {flags_line(argv, work)}")


if __name__ == "__main__":
    main()
