"""The launch-time checks: the flags against the launch's accelerator and processes, all in one list."""

import dataclasses
from types import SimpleNamespace

from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS
from diffsynth.training.config import parse_args
from diffsynth.training.startup import launch_problems

MODELS = ",".join(f"{QWEN_IMAGE_MODEL_ID}:{QWEN_IMAGE_PATTERNS[name]}" for name in ("dit", "text_encoder", "vae"))


@dataclasses.dataclass
class FakeAccelerator:
    """What the launch checks read of an ``Accelerator``: its processes and its DeepSpeed config (None: none)."""

    num_processes: int = 1
    deepspeed: dict | None = None

    @property
    def state(self):
        plugin = None if self.deepspeed is None else SimpleNamespace(deepspeed_config=self.deepspeed)
        return SimpleNamespace(deepspeed_plugin=plugin)


def config(*flags):
    return parse_args(["--model_id_with_origin_paths", MODELS, "--dataset_metadata_path", "m.csv",
                       "--lora_base_model", "dit", *flags])


def test_a_plain_launch_has_no_problem():
    assert launch_problems(config(), FakeAccelerator()) == []
    assert launch_problems(config("--max_grad_norm", "0.5"), FakeAccelerator(8, {"gradient_clipping": "auto"})) == []


def test_every_problem_of_a_launch_comes_at_once():
    run = config("--enable_model_cpu_offload", "--max_grad_norm", "0.5")
    offload, clipping = launch_problems(run, FakeAccelerator(2, {"gradient_clipping": 1.0}))
    assert offload.startswith("--enable_model_cpu_offload and DeepSpeed both decide where the weights live")
    assert clipping.startswith("--max_grad_norm 0.5 but the DeepSpeed config sets gradient_clipping 1.0")
    fused = config("--fused_optimizer_step")
    under_deepspeed, processes = launch_problems(fused, FakeAccelerator(2, {}))
    assert under_deepspeed.startswith("--fused_optimizer_step cannot run under DeepSpeed")
    assert processes.startswith("--fused_optimizer_step runs in one process, not 2")
    # Without DeepSpeed only the process count is the launch's business.
    assert launch_problems(fused, FakeAccelerator(2)) == [processes]
    assert launch_problems(fused, FakeAccelerator(1)) == []
