"""Host memory of training on several processes of one machine: one shared copy of the frozen weights, or one each.

    python scripts/bench_host_memory.py                              # 1, 2 and 4 processes, --enable_model_cpu_offload
    python scripts/bench_host_memory.py --placement block_swap       # --blocks_to_swap (half the blocks)
    python scripts/bench_host_memory.py --processes 1,2,8 --layers 16

Builds a Qwen-Image repo whose transformer has the real block layout at a reduced width (hidden 512, ``--layers``
blocks of about 38 MB in float32: 300 MB for the default 8) beside the tiny text encoder and VAE, then trains a LoRA
for two steps under ``torchrun`` (on the CPU: gloo) with each process count, once with
``--shared_host_weights auto`` and once with ``off`` (one process has nothing to share: it runs once). Each process
reads its proportional set size (PSS, ``/proc/self/smaps_rollup``) after the first optimizer step, every process
there at once, and samples its peak over the run. PSS splits a page among the processes that map it, so the
processes' PSS add up to the memory they use together: a shared copy counts once in the total, a private copy once
per process.

Printed per run: PSS per process during training and at its peak, their total, the part of the total in shared
segments, and the total minus the one-process run's; then per process count what the shared copy saves against one
copy per process, in copies of what it holds (the weights the placement keeps in host memory): one per extra
process. On the CPU the "device" is host memory too: activations, the weights copied in for compute and, with block
swap, the blocks that stay resident count in every process's PSS; on a GPU they are on the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024


# ---- one rank ------------------------------------------------------------------------------------------------------

class PssSampler(threading.Thread):
    """Reads this process's PSS every ``interval`` seconds and keeps the largest."""

    def __init__(self, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.interval, self.peak, self._stop_event = interval, 0, threading.Event()

    def run(self) -> None:
        from diffsynth.core.shared_weights.pss import process_pss

        while not self._stop_event.is_set():
            self.peak = max(self.peak, process_pss())
            time.sleep(self.interval)

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return self.peak


def run_rank(argv: list[str], report: Path) -> None:
    """Trains with ``argv`` in this (launched) process; after the first optimizer step, with every process there,
    measures its PSS, and writes the figures to ``report.<rank>``."""
    import gc

    import torch.distributed as dist

    from diffsynth.core.offload_training.memory_buffer import tensor_nbytes
    from diffsynth.core.shared_weights.pss import process_pss, segment_pss
    from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
    from diffsynth.training.entry import main
    from diffsynth.training.outputs.logger import ModelLogger

    figures = {}
    on_step_end = ModelLogger.on_step_end

    def measure_after_the_first_step(logger, step, *args, **kwargs):
        if step == 1:  # every process calls this after each optimizer step, so the barriers meet
            gc.collect()
            dist.barrier()
            figures.update(pss=process_pss(), segment=segment_pss())
            dist.barrier()  # nobody moves on (and frees or maps more) before everybody has measured
        return on_step_end(logger, step, *args, **kwargs)

    ModelLogger.on_step_end = measure_after_the_first_step
    sampler = PssSampler()
    sampler.start()
    result = main(QwenImagePipeline, argv)
    figures["peak"] = sampler.stop()
    figures["frozen"] = sum(tensor_nbytes(p) for model in result["module"].pipe.model_names()
                            for p in getattr(result["module"].pipe, model).parameters() if not p.requires_grad)
    Path(f"{report}.{dist.get_rank()}").write_text(json.dumps(figures))


# ---- the benchmark -------------------------------------------------------------------------------------------------

def build_repo(root: Path, layers: int) -> None:
    """The tiny Qwen-Image repo with a wider, deeper transformer (float32, sharded as the real repo)."""
    import torch
    from diffusers import QwenImageTransformer2DModel

    from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID, build_tiny_qwen_image

    repo = build_tiny_qwen_image(root)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        transformer = QwenImageTransformer2DModel(
            patch_size=2, in_channels=64, out_channels=16, num_layers=layers, attention_head_dim=64,
            num_attention_heads=8, joint_attention_dim=32, guidance_embeds=False, axes_dims_rope=(16, 24, 24))
    for file in (repo / "transformer").iterdir():
        file.unlink()
    transformer.save_pretrained(repo / "transformer", max_shard_size="100MB")
    assert repo == root / QWEN_IMAGE_MODEL_ID


def training_flags(data: Path, output: Path, placement: str, layers: int) -> list[str]:
    from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS

    models = ",".join(f"{QWEN_IMAGE_MODEL_ID}:{QWEN_IMAGE_PATTERNS[name]}" for name in ("dit", "text_encoder", "vae"))
    flags = ["--dataset_base_path", str(data), "--dataset_metadata_path", str(data / "metadata.csv"),
             "--model_id_with_origin_paths", models, "--lora_base_model", "dit", "--lora_target_modules",
             "to_q,to_k,to_v", "--lora_rank", "4", "--torch_dtype", "float32", "--max_pixels", "4096",
             "--use_gradient_checkpointing", "--max_train_steps", "2", "--dataset_repeat", "8", "--seed", "0",
             "--output_path", str(output)]
    if placement == "offload":
        return [*flags, "--enable_model_cpu_offload"]
    return [*flags, "--blocks_to_swap", str(layers // 2)]


def launch(processes: int, flags: list[str], report: Path, root: Path) -> list[dict]:
    # torchrun rather than accelerate launch: one process also runs under torch.distributed, as several do.
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
               str(Path(__file__).resolve()), "--worker", str(report), *flags]
    env = {**os.environ, "DIFFSYNTH_MODEL_BASE_PATH": str(root), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the {processes}-process run failed:\n{done.stderr[-4000:]}")
    return [json.loads(Path(f"{report}.{rank}").read_text()) for rank in range(processes)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", default="1,2,4", help="Process counts to run, comma-separated.")
    parser.add_argument("--layers", type=int, default=8, help="Transformer blocks (about 38 MB each in float32).")
    parser.add_argument("--placement", choices=("offload", "block_swap"), default="offload",
                        help="--enable_model_cpu_offload, or --blocks_to_swap of half the blocks.")
    args = parser.parse_args()
    from diffsynth.core.data.example_dataset import build_example_dataset

    with tempfile.TemporaryDirectory() as scratch:
        root, data = Path(scratch) / "models", Path(scratch) / "data"
        build_repo(root, args.layers)
        build_example_dataset(data, num_images=2)
        rows, baseline = [], None
        for processes in [int(count) for count in args.processes.split(",")]:
            for sharing in (("auto",) if processes == 1 else ("auto", "off")):
                name = f"{processes}-{sharing}"
                flags = training_flags(data, Path(scratch) / name, args.placement, args.layers)
                ranks = launch(processes, [*flags, "--shared_host_weights", sharing], Path(scratch) / name, root)
                total = sum(rank["pss"] for rank in ranks)
                baseline = total if processes == 1 else baseline
                rows.append((processes, "shared" if processes > 1 and sharing == "auto" else "per process",
                             [rank["pss"] for rank in ranks], [rank["peak"] for rank in ranks], total,
                             sum(rank["peak"] for rank in ranks), sum(rank["segment"] for rank in ranks),
                             ranks[0]["frozen"]))
    frozen = rows[0][-1]
    print(f"{args.placement}, Qwen-Image transformer of {args.layers} blocks at hidden 512 with the tiny text encoder "
          f"and VAE: {frozen / MIB:.0f} MiB of frozen weights (float32)\n")
    print("| processes | frozen weights in host memory | PSS per process, MiB | total, MiB | in shared segments, MiB | "
          "total - 1 process, MiB | peak per process, MiB |")
    print("| ---: | --- | --- | ---: | ---: | ---: | --- |")
    totals, segments = {}, {}
    for processes, mode, pss, peaks, total, _, segment, _ in rows:
        totals[processes, mode], segments[processes, mode] = total, segment
        print(f"| {processes} | {mode} | {', '.join(f'{p / MIB:.0f}' for p in pss)} | {total / MIB:.0f} | "
              f"{segment / MIB:.0f} | {(total - baseline) / MIB:+.0f} | {', '.join(f'{p / MIB:.0f}' for p in peaks)} |")
    print()
    for processes in sorted({count for count, _ in totals if count > 1}):
        saved = totals[processes, "per process"] - totals[processes, "shared"]
        held = segments[processes, "shared"]
        print(f"{processes} processes: one shared copy ({held / MIB:.0f} MiB) saves {saved / MIB:.0f} MiB = "
              f"{saved / held:.2f} copies of it (one per extra process: {processes - 1})")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        run_rank(sys.argv[3:], Path(sys.argv[2]))
    else:
        main()
