"""Every process compares its code and resolved flags with the main process's at start-up (the launches of two
machines: tests/training/test_multi_machine.py)."""

import dataclasses

from diffsynth.training.config.parsers import read_flags
from diffsynth.training.machines import ProcessIdentity, agreement_problems

FLAGS = ["--dataset_base_path", "data", "--dataset_metadata_path", "data/metadata.csv", "--model_paths",
         "dit.safetensors", "--lora_base_model", "dit", "--lora_rank", "4", "--output_path", "out0"]


def identity(rank, *extra, machine=None):
    config = read_flags([*FLAGS, *extra]).run_config()
    one = ProcessIdentity.of_this_process(config, rank)
    return dataclasses.replace(one, machine=rank if machine is None else machine)


def test_identical_processes_agree_and_the_output_folder_may_differ_per_machine():
    assert agreement_problems([identity(0), identity(1, "--output_path", "/local/disk/out")]) == []
    assert agreement_problems([]) == []  # a single process gathers nothing


def test_another_flag_on_a_machine_is_named_with_both_values():
    [problem] = agreement_problems([identity(0), identity(1), identity(2, "--lora_rank", "8", "--seed", "5")])
    assert problem.startswith("rank 2 (machine 2, host ")
    assert "--lora_rank 8 there, 4 on the main process; --seed 5 there, (unset) on the main process" in problem


def test_other_code_on_a_machine_is_named_with_both_digests():
    other = dataclasses.replace(identity(1), code="0123456789abcdef")
    [problem] = agreement_problems([identity(0), other])
    assert "rank 1 (machine 1, host" in problem and "runs other code than the main process" in problem
    assert f"(source digest 0123456789abcdef) there, {identity(0).version} ({identity(0).code}) here" in problem
