"""Where a user waits before training starts: a flag error, the tiny model's first step, ``lora inspect``.

    python scripts/bench_startup.py                          # this checkout
    python scripts/bench_startup.py --baseline /tmp/old      # and another checkout of diffsynth beside it

Each case runs as a fresh ``python`` process (the state a user starts from) and is measured by the CPU time the
process used (user + system, from ``wait4``), so the load of a shared machine distorts it less than the wall time,
which is printed beside it. Cases:

- ``flag error``: ``examples/qwen_image/model_training/train.py --lora_rnak 4`` (exit 2, one line);
- ``first step``: a tiny Qwen-Image LoRA run in the released layout, built here, stopped after one optimizer step
  (``--max_train_steps 1``): flags, loading, LoRA, dataset, accelerate and the step;
- ``lora inspect``: ``python -m diffsynth.lora inspect`` of the LoRA file that run wrote (``step-1.safetensors``);
- ``offline``: the first step's run with no models on disk and the hubs' addresses on a closed local port (exit 2,
  one message): how long a user without a network waits for the answer. The tests count that run's network
  attempts instead of timing it (``tests/training/test_trainer_downloads.py``).

With ``--baseline``, every case also runs against that checkout (its ``diffsynth`` first on ``PYTHONPATH``), in the
same process order, and the ratio of CPU times is printed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
QWEN = ",".join(f"Qwen/Qwen-Image:{pattern}" for pattern in (
    "transformer/diffusion_pytorch_model*.safetensors", "text_encoder/model*.safetensors",
    "vae/diffusion_pytorch_model.safetensors"))


def measured(command: list[str], checkout: Path, env: dict[str, str]) -> tuple[float, float, int]:
    """``(CPU seconds, wall seconds, exit code)`` of ``command`` run from ``checkout``."""
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=checkout, env={**env, "PYTHONPATH": str(checkout)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    return usage.ru_utime + usage.ru_stime, wall, os.waitstatus_to_exitcode(status)


def cases(work: Path, label: str) -> dict[str, list[str]]:
    """The commands of each case, for the checkout ``label``; its first step writes to a folder of its own."""
    train = [sys.executable, "examples/qwen_image/model_training/train.py"]
    output = work / f"lora-{label}"
    run = [*train, "--dataset_base_path", str(work / "dataset"), "--dataset_metadata_path",
           str(work / "dataset" / "metadata.csv"), "--model_id_with_origin_paths", QWEN, "--lora_base_model", "dit",
           "--remove_prefix_in_ckpt", "pipe.dit.", "--torch_dtype", "float32", "--max_pixels", "4096",
           "--max_train_steps", "1", "--output_path", str(output), "--overwrite_output"]
    hub = "http://127.0.0.1:9"  # the discard port, closed on any machine that runs no discard service
    offline = ["env", f"DIFFSYNTH_MODEL_BASE_PATH={work / f'no-models-{label}'}", f"MODELSCOPE_ENDPOINT={hub}",
               f"HF_ENDPOINT={hub}", *run[:-3], "--output_path", str(work / f"offline-{label}")]
    return {"flag error": [*train, "--lora_rnak", "4"], "first step": run,
            "lora inspect": [sys.executable, "-m", "diffsynth.lora", "inspect", str(output / "step-1.safetensors")],
            "offline": offline}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout of diffsynth to compare with")
    parser.add_argument("--repeats", type=int, default=2, help="runs per case and checkout; the fastest is kept")
    args = parser.parse_args()
    checkouts = {"this": REPO, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "DIFFSYNTH_MODEL_BASE_PATH": str(work / "models")}
        subprocess.run([sys.executable, "-m", "diffsynth.testing.tiny_models", "--output", str(work / "models"),
                        "--only", "qwen_image"], cwd=REPO, env=env, check=True, capture_output=True)
        subprocess.run([sys.executable, "-m", "diffsynth.core.data.example_dataset", "--output",
                        str(work / "dataset"), "--num_images", "2"], cwd=REPO, env=env, check=True,
                       capture_output=True)
        results: dict[tuple[str, str], tuple[float, float, int]] = {}
        for name in cases(work, "this"):
            for label, checkout in checkouts.items():
                runs = [measured(cases(work, label)[name], checkout, env) for _ in range(args.repeats)]
                results[name, label] = min(runs)
    print(f"{'case':14} {'checkout':9} {'CPU s':>7} {'wall s':>7} {'exit':>5}")
    for (name, label), (cpu, wall, code) in results.items():
        print(f"{name:14} {label:9} {cpu:7.2f} {wall:7.2f} {code:5d}")
    if args.baseline:
        for name in cases(Path(), "this"):
            print(f"{name}: this / baseline CPU = {results[name, 'this'][0] / results[name, 'baseline'][0]:.2f}")


if __name__ == "__main__":
    main()
