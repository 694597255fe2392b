"""Launched by ``accelerate launch`` in test_shared_host_weights.py: trains once per flag set (``--then`` separates
them) in the same processes, and after each run writes what this rank holds to ``<output_path>/rank<N>.json``.

    shared_weights_run.py qwen|wan|flux <flags> [--then <flags> ...]
"""

import gc
import json
import sys
from pathlib import Path

from diffsynth.core.unused_libraries import keep_out

keep_out("bitsandbytes")  # before diffusers and peft look for it: as the trainer's command line does

import torch.distributed as dist  # noqa: E402

from diffsynth.core.offload_training.memory_buffer import tensor_nbytes  # noqa: E402
from diffsynth.core.shared_weights import is_shared_host  # noqa: E402
from diffsynth.core.shared_weights.pss import segment_pss  # noqa: E402
from diffsynth.training.entry import main  # noqa: E402
from tests.conftest import reset_accelerate_state  # noqa: E402


def train(family: str, argv: list[str]) -> dict:
    if family == "wan":
        from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline

        return main(WanVideoPipeline, argv, video=True)
    if family == "flux":
        from diffsynth.pipelines.flux.pipeline import FluxPipeline

        return main(FluxPipeline, argv)
    from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline

    return main(QwenImagePipeline, argv)


def report(module) -> dict:
    """The frozen parameters of the trained models, which of them live in the shared copy, and this process's
    proportional share of the shared segments (both ranks alive and done reading them)."""
    frozen = {f"{model}.{name}": param for model in module.pipe.model_names()
              for name, param in getattr(module.pipe, model).named_parameters() if not param.requires_grad}
    shared = [name for name, param in frozen.items() if is_shared_host(param)]
    dist.barrier()
    pss = segment_pss()
    dist.barrier()  # neither rank drops its mappings before both have measured
    return {"frozen": sorted(frozen), "shared": sorted(shared),
            "shared_bytes": sum(tensor_nbytes(frozen[name]) for name in shared), "segment_pss": pss}


def run_all(family: str, argv: list[str]) -> None:
    runs, current = [], []
    for arg in argv:
        if arg == "--then":
            runs.append(current)
            current = []
        else:
            current.append(arg)
    runs.append(current)
    for flags in runs:
        result = train(family, flags)
        output = Path(flags[flags.index("--output_path") + 1])
        held = report(result["module"])
        (output / f"rank{dist.get_rank()}.json").write_text(json.dumps(held))
        del result
        gc.collect()  # the run's models, and with them its segments, go before the next run measures
        if flags is not runs[-1]:
            reset_accelerate_state()


if __name__ == "__main__":
    run_all(sys.argv[1], sys.argv[2:])
