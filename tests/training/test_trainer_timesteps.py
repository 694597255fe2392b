"""Timestep rules through the CLI trainer on the tiny Qwen-Image: a rule reaches the loss, and split training draws
what one-stage training draws under it."""

import pytest

from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.training.entry import main
from tests.training.conftest import lora, max_difference
from tests.training.test_trainer import COMMON, PATTERN, raw

RULE = ["--timestep_sampling", "qwen_shift", "--weighting_scheme", "cosmap", "--sigmoid_scale", "1.5"]


@pytest.fixture(autouse=True)
def in_process_runs(base, fresh_accelerate_state):
    """Every test here runs the trainer in-process on the tiny repos."""


def test_a_rule_changes_the_lora_and_split_training_draws_it_alike(dataset, tmp_path):
    flags = [*COMMON, "--num_epochs", "1"]
    main(QwenImagePipeline, [*raw(dataset), *flags, "--output_path", str(tmp_path / "reference")])
    one = main(QwenImagePipeline, [*raw(dataset), *flags, *RULE, "--output_path", str(tmp_path / "one")])
    main(QwenImagePipeline, [*raw(dataset), *flags, "--output_path", str(tmp_path / "cache"), "--task",
                             "sft:data_process", "--offload_models", PATTERN["dit"]])
    two = main(QwenImagePipeline, ["--dataset_base_path", str(tmp_path / "cache"), *flags, *RULE, "--output_path",
                                   str(tmp_path / "two"), "--task", "sft:train"])
    assert one["losses"] == pytest.approx(two["losses"], abs=1e-6)
    assert max_difference(lora(tmp_path / "one", "epoch-0"), lora(tmp_path / "two", "epoch-0")) < 1e-6
    assert max_difference(lora(tmp_path / "one", "epoch-0"), lora(tmp_path / "reference", "epoch-0")) > 1e-5
