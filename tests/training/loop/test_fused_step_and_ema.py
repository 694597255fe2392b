"""The fused backward+step, the EMA of the trained weights and 8-bit optimizers, each against plain PyTorch training.

The mechanisms are checked on small torch modules (plain ``AdamW.step()`` after a whole backward is the reference);
the trainer tests at the end train the tiny Qwen-Image DiT in full through ``main`` and compare the files written.
"""

import copy
import shutil

import pytest
import torch
from safetensors.torch import load_file

from diffsynth.core.offload_training import OffloadTrainingManager
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS
from diffsynth.training.config.errors import FlagError
from diffsynth.training.config.placement import PlacementConfig
from diffsynth.training.config.training import TrainingSection, optimizer_placement_problems
from diffsynth.training.entry import main
from diffsynth.training.loop.ema import WeightEMA
from diffsynth.training.loop.fused_step import FusedOptimizerStep
from diffsynth.training.loop.optimizer import make_optimizer
from diffsynth.training.outputs.checkpoint import load_training_state, save_training_state
from tests.training.conftest import max_difference

STEPS = 3


def small_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    # 64 x 96 = 6144 elements: above bitsandbytes' 4096, so its 8-bit state is really 8-bit.
    return torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 64), torch.nn.GELU(),
                               torch.nn.Linear(64, 8))


def batches(count: int = STEPS) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(5, 64, generator=generator) for _ in range(count)]


def schedule(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - 0.25 * step)


def train(model, optimizer, inputs, fused: FusedOptimizerStep | None = None):
    """The loop's order: backward (the fused step updates inside it), else step; then the schedule."""
    scheduler = schedule(optimizer)
    for batch in inputs:
        loss = model(batch).pow(2).mean()
        if fused is not None:
            fused.begin()
        loss.backward()
        if fused is None:
            optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    return scheduler


def test_the_fused_step_trains_what_the_plain_step_trains_holding_no_gradient():
    plain, fused_model = small_model(), small_model()
    plain_optimizer = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    optimizer = torch.optim.AdamW(fused_model.parameters(), lr=1e-2)
    params = list(fused_model.parameters())
    fused = FusedOptimizerStep(optimizer, params)
    held = []
    for param in params:  # registered after the fused step's hooks, so they see what it left
        param.register_post_accumulate_grad_hook(
            lambda _param: held.append(sum(p.grad is not None for p in params)))
    train(plain, plain_optimizer, batches())
    train(fused_model, optimizer, batches(), fused)
    assert len(held) == STEPS * len(params) and max(held) == 0
    assert fused.updated == len(params)
    assert max_difference(plain.state_dict(), fused_model.state_dict()) < 1e-7
    # The state has the plain step's layout (one group, the schedule's learning rate): either resumes the other.
    state = optimizer.state_dict()
    assert [group["lr"] for group in state["param_groups"]] == [group["lr"] for group in
                                                               plain_optimizer.state_dict()["param_groups"]]
    assert state["state"].keys() == plain_optimizer.state_dict()["state"].keys()


def test_the_fused_step_under_optimizer_offload_updates_the_host_masters_as_the_plain_step():
    plain, offloaded = small_model(), small_model()
    plain_optimizer = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    manager = OffloadTrainingManager(offloaded, "cpu", enable_optimizer_cpu_offload=True)
    params = list(offloaded.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    fused = FusedOptimizerStep(optimizer, params, [manager])
    train(plain, plain_optimizer, batches())
    scheduler = schedule(optimizer)
    for batch in batches():
        fused.begin()
        offloaded(batch).pow(2).mean().backward()
        assert fused.updated == len(params)  # every update ran in backward, through the manager's hooks
        manager.after_backward()
        assert all(param.grad is None for param in params)  # nothing left for a step
        scheduler.step()
    manager.remove()
    assert max_difference(plain.state_dict(), offloaded.state_dict()) < 1e-7


def test_a_non_finite_gradient_stops_the_updates_of_its_backward():
    model = small_model()
    before = copy.deepcopy(model.state_dict())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    fused = FusedOptimizerStep(optimizer, list(model.parameters()))
    last = model[4].bias  # its gradient is complete first in backward
    last.register_hook(lambda grad: torch.full_like(grad, float("nan")))
    fused.begin()
    model(batches(1)[0]).pow(2).mean().backward()
    assert not fused.clean and fused.updated == 0
    assert max_difference(before, model.state_dict()) == 0
    assert all(param.grad is None for param in model.parameters())


def test_8bit_adamw_steps_per_weight_as_it_steps_all_at_once_and_resumes(tmp_path):
    bnb = pytest.importorskip("bitsandbytes")
    plain, fused_model = small_model(), small_model()
    plain_optimizer = bnb.optim.AdamW8bit(plain.parameters(), lr=1e-2)
    optimizer = bnb.optim.AdamW8bit(fused_model.parameters(), lr=1e-2)
    initial = copy.deepcopy(plain.state_dict())
    train(plain, plain_optimizer, batches())
    scheduler = train(fused_model, optimizer, batches(), FusedOptimizerStep(optimizer, list(fused_model.parameters())))
    assert max_difference(initial, plain.state_dict()) > 1e-3  # it trains
    assert max_difference(plain.state_dict(), fused_model.state_dict()) == 0
    assert plain_optimizer.state[plain[0].weight]["state1"].dtype == torch.uint8  # 8-bit moments
    # Through a training-state checkpoint and back: the resumed optimizer continues as the uninterrupted one.
    folder = save_training_state(tmp_path, {"w": torch.zeros(1)}, plain_optimizer.state_dict(),
                                 scheduler.state_dict(), {"global_step": STEPS, "micro_step": STEPS, "epoch": 0,
                                                          "batch_in_epoch": STEPS, "seed": 0})
    _, optimizer_state, _, _ = load_training_state(folder)
    resumed_model = copy.deepcopy(plain)
    resumed = bnb.optim.AdamW8bit(resumed_model.parameters(), lr=1e-2)
    resumed.load_state_dict(optimizer_state)
    more = batches(STEPS + 2)[STEPS:]
    train(plain, plain_optimizer, more)
    train(resumed_model, resumed, more)
    assert max_difference(plain.state_dict(), resumed_model.state_dict()) == 0


def test_the_ema_is_the_moving_average_of_the_weights_and_round_trips():
    model = small_model()
    weights = dict(model.named_parameters())
    ema = WeightEMA(weights, 0.8)
    expected = {name: value.detach().clone() for name, value in weights.items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for batch in batches():
        model(batch).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        ema.update()
        expected = {name: 0.8 * expected[name] + 0.2 * weights[name].detach() for name in expected}
    assert max_difference(expected, ema.state_dict()) < 1e-6
    assert all(value.dtype == torch.float32 and value.device.type == "cpu" for value in ema.state_dict().values())
    again = WeightEMA(weights, 0.8)
    again.load_state_dict(ema.state_dict())
    assert max_difference(again.state_dict(), ema.state_dict()) == 0
    with pytest.raises(ValueError, match="differ from this run's trained weights"):
        again.load_state_dict({"other": torch.zeros(1)})


@pytest.mark.parametrize(("fields", "fragment"), [
    ({"ema_decay": 1.0}, r"--ema_decay 1.0 must lie strictly between 0 and 1"),
    ({"fused_optimizer_step": True, "gradient_accumulation_steps": 2},
     "--fused_optimizer_step and --gradient_accumulation_steps 2 cannot be combined"),
    ({"fused_optimizer_step": True, "max_grad_norm": 1.0}, "--fused_optimizer_step and --max_grad_norm 1 cannot"),
    ({"fused_optimizer_step": True, "mixed_precision": "fp16"}, "--mixed_precision bf16"),
    ({"fused_optimizer_step": True, "task": "sft:data_process"}, "trains nothing"),
])  # fmt: skip
def test_flags_the_fused_step_and_the_ema_cannot_take_are_refused(fields, fragment):
    with pytest.raises(FlagError, match=fragment):
        TrainingSection(**fields)


def test_paged_optimizers_and_the_fused_step_are_refused_where_they_cannot_work():
    paged = TrainingSection(customized_optimizer="bitsandbytes.optim.PagedAdamW8bit")
    problems = optimizer_placement_problems(paged, PlacementConfig(enable_model_cpu_offload=True,
                                                                   enable_optimizer_cpu_offload=True))
    assert len(problems) == 1 and "--customized_optimizer bitsandbytes.optim.AdamW8bit" in problems[0]
    if not torch.cuda.is_available():
        (problem,) = paged.device_problems()
        assert "needs CUDA" in problem and "bitsandbytes.optim.AdamW8bit" in problem
    assert TrainingSection(customized_optimizer="bitsandbytes.optim.AdamW8bit").device_problems() == []
    (problem,) = optimizer_placement_problems(TrainingSection(fused_optimizer_step=True),
                                              PlacementConfig(blocks_to_swap=1))
    assert "--fused_optimizer_step and --blocks_to_swap 1 cannot be combined" in problem
    # Weights in host memory (a CPU run, optimizer offload) are refused when the optimizer is made, too.
    with pytest.raises(ValueError, match="1 trained weight.s. are in host memory .* bitsandbytes.optim.AdamW8bit"):
        make_optimizer([torch.nn.Parameter(torch.zeros(4))], 1e-3, 0.0, None, "bitsandbytes.optim.PagedAdamW8bit")


def test_the_launch_the_fused_step_and_the_ema_cannot_run_under_is_refused_before_loading():
    from diffsynth.training.config import parse_args
    from diffsynth.training.loop.fused_step import process_problems
    from diffsynth.training.startup.launch_checks import launch_problems
    from tests.training.startup.test_launch_checks import FakeAccelerator

    fused = TrainingSection(fused_optimizer_step=True)
    (problem,) = process_problems(fused, 2)
    assert "--fused_optimizer_step runs in one process, not 2" in problem
    assert process_problems(fused, 1) == [] and process_problems(TrainingSection(), 8) == []
    models = ",".join(f"{QWEN_IMAGE_MODEL_ID}:{QWEN_IMAGE_PATTERNS[name]}" for name in ("dit", "text_encoder", "vae"))
    config = parse_args(["--model_id_with_origin_paths", models, "--dataset_metadata_path", "m.csv",
                         "--trainable_models", "dit", "--fused_optimizer_step", "--ema_decay", "0.9"])
    refused = "\n".join(launch_problems(config, FakeAccelerator(deepspeed={})))
    assert "--fused_optimizer_step cannot run under DeepSpeed" in refused
    assert "--ema_decay 0.9 cannot run under DeepSpeed" in refused


@pytest.mark.gpu
def test_a_paged_8bit_optimizer_steps_per_weight_on_cuda():
    bnb = pytest.importorskip("bitsandbytes")
    plain, fused_model = small_model().cuda(), small_model().cuda()
    plain_optimizer = bnb.optim.PagedAdamW8bit(plain.parameters(), lr=1e-2)
    optimizer = bnb.optim.PagedAdamW8bit(fused_model.parameters(), lr=1e-2)
    inputs = [batch.cuda() for batch in batches()]
    train(plain, plain_optimizer, inputs)
    train(fused_model, optimizer, inputs, FusedOptimizerStep(optimizer, list(fused_model.parameters())))
    assert max_difference(plain.state_dict(), fused_model.state_dict()) < 1e-6


# ---- through the trainer, on the tiny Qwen-Image DiT trained in full --------------------------------------------

MODELS = ",".join(f"{QWEN_IMAGE_MODEL_ID}:{QWEN_IMAGE_PATTERNS[name]}" for name in ("dit", "text_encoder", "vae"))
OPTIMIZER_OFFLOAD = ["--enable_model_cpu_offload", "--enable_optimizer_cpu_offload"]


# The trainer tests run in-process on the tiny repos.
trainer_run = pytest.mark.usefixtures("base", "fresh_accelerate_state")


def full_fine_tune(dataset, output, *extra):
    """Three steps over three images; the linear schedule changes the learning rate every step."""
    return main(QwenImagePipeline, [
        "--dataset_base_path", str(dataset), "--dataset_metadata_path", str(dataset / "metadata.csv"),
        "--model_id_with_origin_paths", MODELS, "--trainable_models", "dit", "--torch_dtype", "float32", "--seed", "3",
        "--max_pixels", "4096", "--learning_rate", "1e-3", "--lr_scheduler", "linear", "--output_path", str(output),
        *extra,
    ])  # fmt: skip


def initial_dit(tiny_root) -> dict[str, torch.Tensor]:
    folder = tiny_root / QWEN_IMAGE_MODEL_ID / QWEN_IMAGE_PATTERNS["dit"].split("/")[0]
    return {key: value for shard in sorted(folder.glob("*.safetensors")) for key, value in load_file(shard).items()}


@pytest.fixture(scope="module")
def plain_run(dataset, tmp_path_factory, tiny_root):
    """A plain AdamW run with an EMA, its weights and its EMA saved (with a checkpoint) after every step."""
    from tests.conftest import reset_accelerate_state

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        output = tmp_path_factory.mktemp("plain") / "out"
        result = full_fine_tune(dataset, output, "--ema_decay", "0.7", "--save_steps", "1",
                                "--checkpoints_total_limit", str(STEPS))
    reset_accelerate_state()
    return output, result


@trainer_run
# Recomputed activations (gradient checkpointing) reach the weights' gradients in backward too.
@pytest.mark.parametrize("placement", [[], [*OPTIMIZER_OFFLOAD, "--use_gradient_checkpointing"]],
                         ids=["on_device", "optimizer_offload_checkpointing"])
def test_the_fused_step_trains_the_plain_runs_weights(plain_run, dataset, tmp_path, placement):
    output, reference = plain_run
    result = full_fine_tune(dataset, tmp_path, "--fused_optimizer_step", *placement)
    assert result["losses"] == pytest.approx(reference["losses"], abs=1e-6)
    assert max_difference(load_file(output / "epoch-0.safetensors"), load_file(tmp_path / "epoch-0.safetensors")) < 1e-5


@trainer_run
def test_the_ema_files_are_the_moving_average_of_the_runs_weights(plain_run, tiny_root):
    output, result = plain_run
    assert result["global_step"] == STEPS
    expected = initial_dit(tiny_root)
    for step in range(1, STEPS + 1):
        weights = load_file(output / f"step-{step}.safetensors")
        expected = {name: 0.7 * expected[name] + 0.3 * weights[name] for name in weights}
        assert max_difference(expected, load_file(output / f"step-{step}-ema.safetensors")) < 1e-6
    assert max_difference(expected, load_file(output / "epoch-0-ema.safetensors")) < 1e-6
    assert max_difference(expected, load_file(output / "epoch-0.safetensors")) > 1e-4  # not the weights


@trainer_run
def test_a_resumed_ema_run_ends_bit_identical(plain_run, dataset, tmp_path):
    output, _ = plain_run
    checkpoint = tmp_path / "step-1"
    shutil.copytree(output / "checkpoints" / "step-1", checkpoint)
    resumed = full_fine_tune(dataset, tmp_path / "out", "--ema_decay", "0.7", "--save_steps", "1",
                             "--resume_from_checkpoint", str(checkpoint))
    assert resumed["global_step"] == STEPS
    for name in ("epoch-0", "epoch-0-ema"):
        assert max_difference(load_file(output / f"{name}.safetensors"),
                              load_file(tmp_path / "out" / f"{name}.safetensors")) == 0
    with pytest.raises(FlagError, match="--ema_decay 0.9: the checkpoint .* was trained with --ema_decay 0.7"):
        full_fine_tune(dataset, tmp_path / "again", "--ema_decay", "0.9", "--resume_from_checkpoint", str(checkpoint))


@trainer_run
def test_an_8bit_fused_run_with_optimizer_offload_trains_and_resumes_bit_identical(dataset, tmp_path, tiny_root):
    pytest.importorskip("bitsandbytes")
    # A constant schedule: --max_train_steps shortens a linear one, and the part run would not be the whole's start.
    flags = ["--customized_optimizer", "bitsandbytes.optim.AdamW8bit", "--fused_optimizer_step", *OPTIMIZER_OFFLOAD,
             "--lr_scheduler", "constant"]
    whole = full_fine_tune(dataset, tmp_path / "whole", *flags)
    trained = load_file(tmp_path / "whole" / "epoch-0.safetensors")
    assert max_difference(initial_dit(tiny_root), trained) > 1e-4 and whole["losses"][-1] < whole["losses"][0]
    full_fine_tune(dataset, tmp_path / "part", *flags, "--max_train_steps", "2")
    _, optimizer_state, _, _ = load_training_state(tmp_path / "part" / "checkpoints" / "step-2")
    packed = [state["__bnb_optimizer_quant_state__"] for state in optimizer_state["state"].values()]
    assert any(state.get("state1", torch.zeros(0)).dtype == torch.uint8 for state in packed)  # 8-bit moments
    resumed = full_fine_tune(dataset, tmp_path / "part", *flags, "--resume_from_checkpoint", "latest")
    assert resumed["global_step"] == STEPS
    assert max_difference(trained, load_file(tmp_path / "part" / "epoch-0.safetensors")) == 0
