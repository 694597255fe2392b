"""The planner's full-training rows: gradients, optimizer state by class, the EMA and the fused step, on the device
and in host memory, per placement (the family kit plans
every released architecture without its files)."""

import pytest

from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS
from diffsynth.core.planning.plans import NoPlanFits, Plan, candidate_plans, choose, predict
from diffsynth.core.planning.profiles import GIB, DeviceProfile
from diffsynth.core.planning.training_state import OptimizerState, optimizer_state
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.training.config.parsers import parse_args
from diffsynth.training.placement.planner import build_workload, denoiser_skeleton

FULL = ["--model_id_with_origin_paths", f"{QWEN_IMAGE_MODEL_ID}:{QWEN_IMAGE_PATTERNS['dit']}", "--trainable_models",
        "dit", "--dataset_metadata_path", "unused.csv", "--height", "64", "--width", "64", "--task", "sft"]
PROFILE = DeviceProfile("test", 1 << 30, 10.0, 1.0, "a made-up device")


def test_optimizer_state_by_class():
    big, small = (1 << 20, 2), (100, 2)  # (numel, element size): a bf16 weight of 1 Mi values and a bias
    assert optimizer_state(None).bytes_for([big, small]) == 2 * (2 << 20) + 2 * 200  # two bf16 moments
    eight_bit = optimizer_state("bitsandbytes.optim.AdamW8bit")
    # Two uint8 moments with a float32 scale per 256 values; a tensor under 4,096 values keeps float32 moments.
    assert eight_bit.bytes_for([big]) == 2 * ((1 << 20) + 4 * (1 << 20) // 256)
    assert eight_bit.bytes_for([small]) == 2 * 4 * 100
    assert optimizer_state("bitsandbytes.optim.PagedAdamW8bit").paged
    assert optimizer_state("bitsandbytes.optim.AdamW").bytes_for([big]) == 8 << 20  # 32-bit by default
    assert optimizer_state("bitsandbytes.optim.Lion8bit").moments == 1
    unknown = optimizer_state("my.optim.Thing")
    assert not unknown.known and unknown.bytes_for([big]) == optimizer_state(None).bytes_for([big])
    assert OptimizerState("x", 0).bytes_for([big]) == 0


def full_workload(extra=(), processes=1):
    args = parse_args(FULL + list(extra))
    model, others, _ = denoiser_skeleton(args, QwenImagePipeline)
    return build_workload(model, args, others, QwenImagePipeline.lora_target_aliases, local_processes=processes)


def test_full_training_keeps_gradients_state_and_ema_where_each_placement_puts_them(base):
    adamw, lean = full_workload(), full_workload(["--customized_optimizer", "bitsandbytes.optim.AdamW8bit",
                                                  "--fused_optimizer_step", "--ema_decay", "0.999"])
    trained = adamw.trainable_bytes
    assert not adamw.frozen_base
    values = sum(p.numel() for p in adamw.model.parameters())
    on_device, lean_on_device = (predict(Plan("on", "device"), w, PROFILE) for w in (adamw, lean))
    assert on_device.parts["gradients"] == trained and on_device.parts["optimizer state"] == 2 * trained
    # 8-bit state per tensor (the tiny model's many small tensors keep float32 state); the fused step holds one
    # gradient, the largest, at a time.
    numels = [p.numel() for p in lean.model.parameters()]
    assert lean_on_device.parts["optimizer state"] == sum(2 * (n + 4 * -(-n // 256)) if n >= 4096 else 8 * n
                                                          for n in numels)
    assert lean_on_device.parts["gradients"] == max(p.nbytes for p in lean.model.parameters())
    # The EMA: float32 values in host memory, none on the device.
    assert lean_on_device.host_bytes - on_device.host_bytes == 4 * values
    assert lean_on_device.device_bytes < on_device.device_bytes
    # Optimizer offload: the trained weights move, their state and gradients are kept on the host.
    offloaded = predict(Plan("on", "offload", optimizer_offload=True), adamw, PROFILE)
    kept = predict(Plan("on", "offload"), adamw, PROFILE)
    assert offloaded.parts["optimizer state"] == 0 and offloaded.parts["trained weights"] == 0
    assert kept.parts["optimizer state"] == 2 * trained and kept.parts["trained weights"] == trained
    assert offloaded.host_parts["training"] - kept.host_parts["training"] >= 3 * trained  # state, gradients, staging
    assert offloaded.device_bytes < kept.device_bytes
    # Both are candidates of a full fine-tune; block swap is not with the fused step (the trainer refuses it).
    plans = candidate_plans(adamw)
    assert Plan("on", "offload", optimizer_offload=True) in plans and Plan("on", "offload") in plans
    assert {plan.policy for plan in candidate_plans(lean)} == {"device", "offload"}


def test_the_ema_is_kept_once_per_machine(base):
    one, four = (full_workload(["--ema_decay", "0.99"], processes) for processes in (1, 4))
    plain = full_workload(processes=4)
    plan = Plan("on", "device")
    assert predict(plan, four, PROFILE).host_bytes - predict(plan, plain, PROFILE).host_bytes == one.ema_bytes > 0


def test_no_full_training_plan_fitting_names_the_smallest_host_memory_and_the_lean_options(base):
    workload = full_workload()
    predictions = [predict(plan, workload, PROFILE) for plan in candidate_plans(workload)]
    least_device = min(p.device_bytes for p in predictions)
    with pytest.raises(NoPlanFits) as error:
        choose(predictions, least_device, 1, full_training=True)
    message = str(error.value)
    needed = min(p.host_bytes for p in predictions if p.device_bytes <= least_device)
    assert f"needs {needed / GIB:.1f} GiB of host memory; raise --ram_budget to that" in message
    assert "--customized_optimizer bitsandbytes.optim.AdamW8bit" in message and "--fused_optimizer_step" in message
    assert choose(predictions, least_device, needed, full_training=True).host_bytes <= needed


@pytest.mark.parametrize(("flags", "trained"), [(["--trainable_models", "vace"], ("vace_blocks", "vace_patch_embedding")),
                                                (["--lora_base_model", "vace"], ("vace_blocks",)),
                                                (["--lora_base_model", "dit"], ("blocks",))])
def test_a_model_part_plans_only_its_own_modules(flags, trained):
    from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
    from diffsynth.training.placement.planner import build_architecture

    args = parse_args(["--model_id_with_origin_paths", "Wan-AI/Wan2.1-VACE-1.3B:diffusion_pytorch_model*.safetensors",
                       "--dataset_metadata_path", "unused.csv", "--height", "32", "--width", "32", "--num_frames",
                       "5", *flags], video=True).with_pipeline_defaults(WanVideoPipeline)
    workload = build_workload(build_architecture("wan2.1-vace-1.3b", "bfloat16"), args, (),
                              WanVideoPipeline.lora_target_aliases, scope=WanVideoPipeline.part_scope)
    names = [name for name, param in workload.model.named_parameters() if param.requires_grad]
    assert names and {name.split(".")[0] for name in names} == set(trained)
