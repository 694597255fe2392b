"""The planner's dry runs kept on disk: a second plan of the same run reads them and plans the same table, any change
to the model, its LoRA or the sample shape is planned anew, an unreadable file is run again, and ``off`` keeps none."""

import json
import math

import pytest

from diffsynth.core.planning import dry_run_cache
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.training.config.parsers import parse_args
from diffsynth.training.config.placement import PlacementConfig
from diffsynth.training.placement.planner import build_workload, denoiser_skeleton, plan_workload
from tests.training.placement.test_planner import COMMAND, PROFILE


def workload(*flags):
    args = parse_args([*COMMAND, "--task", "sft", *flags])
    model, others, _ = denoiser_skeleton(args, QwenImagePipeline)
    return build_workload(model, args, others, QwenImagePipeline.lora_target_aliases)


def table(built):
    return plan_workload(built, PlacementConfig(), PROFILE, math.inf, math.inf).rows


@pytest.fixture
def cache(base, tmp_path, monkeypatch):
    monkeypatch.setenv(dry_run_cache.CACHE_ENV, str(tmp_path / "plan-cache"))
    return tmp_path / "plan-cache"


def counting_steps(built):
    calls = []
    step = built.step
    built.step = lambda: calls.append(1) or step()
    return calls


def test_a_second_plan_of_the_same_run_reads_the_dry_runs_and_plans_the_same_table(cache):
    first = workload()
    first_steps = counting_steps(first)
    expected = table(first)
    assert first_steps and sorted(path.name.split("-", 1)[1] for path in cache.iterdir()) == [
        "footprint-checkpointing-False.json", "footprint-checkpointing-True.json",
        "offload-checkpointing-False-prefetch-1-optimizer-False.json",
        "offload-checkpointing-True-prefetch-1-optimizer-False.json"]
    second = workload()
    second_steps = counting_steps(second)
    assert table(second) == expected and not second_steps


@pytest.mark.parametrize("change", [["--lora_rank", "4"], ["--height", "96"], ["--lora_target_modules", "to_q"],
                                    ["--torch_dtype", "float32"]])
def test_a_changed_model_lora_or_shape_is_planned_anew(cache, change):
    assert workload().dry_runs.fingerprint == workload().dry_runs.fingerprint
    assert workload(*change).dry_runs.fingerprint != workload().dry_runs.fingerprint


def test_an_unreadable_result_is_run_again_and_written_anew(cache):
    expected = table(workload())
    broken = next(cache.glob("*-footprint-checkpointing-True.json"))
    broken.write_text('{"saved_bytes": 1')
    again = workload()
    steps = counting_steps(again)
    assert table(again) == expected and steps
    assert set(json.loads(broken.read_text())) >= {"saved_bytes", "flops"}


def test_off_keeps_nothing(base, monkeypatch):
    monkeypatch.setenv(dry_run_cache.CACHE_ENV, "off")
    assert dry_run_cache.cache_folder() is None and workload().dry_runs.folder is None
    monkeypatch.delenv(dry_run_cache.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere")
    assert str(dry_run_cache.cache_folder()) == "/somewhere/diffsynth/plan"


def test_models_whose_tensors_are_alike_but_whose_configs_differ_have_other_fingerprints():
    from accelerate import init_empty_weights
    from diffusers import QwenImageTransformer2DModel

    def model(axes_dims_rope):
        with init_empty_weights():
            return QwenImageTransformer2DModel(num_layers=1, attention_head_dim=16, num_attention_heads=2,
                                               joint_attention_dim=32, in_channels=16, out_channels=4,
                                               axes_dims_rope=axes_dims_rope)

    one, other = model((4, 4, 8)), model((2, 6, 8))
    assert [(n, t.shape) for n, t in [*one.named_parameters(), *one.named_buffers()]] == \
        [(n, t.shape) for n, t in [*other.named_parameters(), *other.named_buffers()]]
    assert dry_run_cache.workload_fingerprint(one, []) != dry_run_cache.workload_fingerprint(other, [])


def test_the_fingerprint_leaves_out_the_config_bookkeeping_whose_order_changes_between_processes():
    from accelerate import init_empty_weights
    from diffusers import QwenImageTransformer2DModel

    # from_config records the keys it defaulted from a set: their order follows the process's hash seed.
    with init_empty_weights():
        model = QwenImageTransformer2DModel.from_config({"num_layers": 1, "attention_head_dim": 16,
                                                         "num_attention_heads": 2, "joint_attention_dim": 32,
                                                         "axes_dims_rope": [4, 4, 8]})
    defaulted = list(model.config._use_default_values)
    assert len(defaulted) > 1
    first = dry_run_cache.workload_fingerprint(model, [])
    model.register_to_config(_use_default_values=defaulted[::-1])
    assert dry_run_cache.workload_fingerprint(model, []) == first
