"""The memory planner sees every block list block swap swaps: FLUX.2's double blocks and then its single blocks."""

from diffsynth.core.offload_training.memory_buffer import tensor_nbytes
from diffsynth.core.planning.plans import Plan, candidate_plans
from diffsynth.training.config.parsers import parse_args
from diffsynth.training.placement.planner import build_architecture, build_workload

COMMAND = ["--model_id_with_origin_paths", "unused:transformer/*.safetensors", "--lora_base_model", "dit",
           "--lora_target_modules", "to_q,to_k", "--dataset_metadata_path", "unused.csv", "--height", "64",
           "--width", "64", "--task", "sft"]


def test_the_flux2_workload_plans_block_swap_over_double_and_single_blocks():
    model = build_architecture("flux.2-klein-4b", "bfloat16")  # 5 double blocks, then 20 single ones
    workload = build_workload(model, parse_args(COMMAND))
    assert len(workload.blocks) == 25
    assert list(workload.blocks) == [*model.transformer_blocks, *model.single_transformer_blocks]
    assert max(plan.blocks_to_swap for plan in candidate_plans(workload)) == 25
    # Swapping every block moves every frozen weight of both lists (the LoRA stays on the device).
    frozen = sum(tensor_nbytes(p) for block in workload.blocks for p in block.parameters() if not p.requires_grad)
    assert workload.residency(Plan("on", "classic", 25)).offloaded_bytes == frozen
    # The single blocks are the last 20: swapping them is most of the weights but less than all of them.
    singles = workload.residency(Plan("on", "classic", 20)).offloaded_bytes
    assert frozen / 2 < singles < frozen
    # The H2D ring holds the largest streamed block: a double block, once one is streamed.
    double = workload.residency(Plan("on", "h2d", 25, ring_size=1)).peak_bytes
    single = workload.residency(Plan("on", "h2d", 1, ring_size=1)).peak_bytes  # streams single block 7
    assert double > single > 0
