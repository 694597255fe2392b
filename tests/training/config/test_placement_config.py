"""The placement configuration: made once from the flags, every conflict reported at once, the engine configs from it."""

import dataclasses

import pytest

from diffsynth.core.offload_training import BlockSwapConfig
from diffsynth.training.config.parsers import build_parser, parse_args
from diffsynth.training.config.placement import PlacementConfig, PlacementError

VALID = ["--model_id_with_origin_paths", "Qwen/Qwen-Image:transformer/*.safetensors", "--lora_base_model", "dit",
         "--dataset_metadata_path", "data/metadata.csv"]


def test_the_flags_make_the_config_and_the_engine_configs_come_from_it():
    config = parse_args(VALID + ["--blocks_to_swap", "3", "--block_swap_h2d_only", "--block_swap_ring_size", "1",
                                 "--use_pinned_memory_for_block_swap", "--use_gradient_checkpointing_offload"])
    placement = config.placement
    assert placement.gradient_checkpointing and placement.weights_on_host
    assert placement.block_swap == BlockSwapConfig(3, h2d_only=True, ring_size=1, use_pinned_memory=True,
                                                   gradient_checkpointing=True)
    offload = parse_args(VALID + [
        "--enable_model_cpu_offload", "--enable_optimizer_cpu_offload", "--cpu_offload_split_threshold", "64",
        "--offload_prefetch_depth", "2"]).placement
    assert offload.offload_options(trains=True) == dict(enable_optimizer_cpu_offload=True,
                                                        cpu_offload_split_threshold=64.0, prefetch_depth=2)
    assert offload.offload_options(trains=False)["enable_optimizer_cpu_offload"] is False
    assert not offload.block_swap.enabled and offload.weights_on_host


def test_the_defaults_place_nothing_anywhere_special():
    placement = PlacementConfig.from_flags(vars(build_parser().parse_args([])))
    assert placement == PlacementConfig()
    assert not placement.weights_on_host and not placement.block_swap.enabled and not placement.gradient_checkpointing


def test_every_conflict_is_reported_at_once_with_flag_value_and_fix():
    with pytest.raises(PlacementError) as error:
        PlacementConfig(enable_optimizer_cpu_offload=True, cpu_offload_split_threshold=0, block_swap_ring_size=0,
                        block_swap_h2d_only=True, offload_prefetch_depth=-2)
    messages = "\n".join(error.value.problems)
    assert len(error.value.problems) == 8
    for fragment in ("--block_swap_ring_size 0 must be at least 1", "--offload_prefetch_depth -2 must be at least 0",
                     "--cpu_offload_split_threshold 0 must be a positive size in MB",
                     "--enable_optimizer_cpu_offload only works together with --enable_model_cpu_offload",
                     "--offload_prefetch_depth -2 has no effect without --enable_model_cpu_offload",
                     "add --blocks_to_swap N", "add --use_gradient_checkpointing"):
        assert fragment in messages
    with pytest.raises(PlacementError, match="--blocks_to_swap -1 must be at least 0; pass e.g. --blocks_to_swap 10"):
        PlacementConfig(blocks_to_swap=-1)


def test_a_valid_config_changed_into_an_invalid_one_is_refused():
    placement = PlacementConfig(use_gradient_checkpointing=True, blocks_to_swap=4, block_swap_h2d_only=True)
    with pytest.raises(PlacementError, match="--block_swap_h2d_only reuses a few GPU slots"):
        dataclasses.replace(placement, use_gradient_checkpointing=False)


def test_host_weights_are_shared_with_several_processes_when_they_live_on_the_host():
    offload, swap = PlacementConfig(enable_model_cpu_offload=True), PlacementConfig(blocks_to_swap=2)
    assert offload.shares_host_weights(2) and swap.shares_host_weights(8)
    assert not offload.shares_host_weights(1) and not PlacementConfig().shares_host_weights(8)
    assert not PlacementConfig(enable_model_cpu_offload=True, shared_host_weights="off").shares_host_weights(2)
    with pytest.raises(PlacementError, match="--shared_host_weights always must be auto"):
        PlacementConfig(shared_host_weights="always")
