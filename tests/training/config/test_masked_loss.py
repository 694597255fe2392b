"""The masked-loss flags: their range, and the masks loaded exactly when a run uses them."""

import pytest

from diffsynth.training.config import RunConfig, build_parser, parse_args
from diffsynth.training.config.errors import FlagError

VALID = ["--model_id_with_origin_paths", "Qwen/Qwen-Image:transformer/*.safetensors", "--lora_base_model", "dit",
         "--dataset_metadata_path", "data/metadata.csv"]
MASKED = [*VALID, "--masked_loss", "--data_file_keys", "image,mask"]


def problems(argv) -> list[str]:
    """The flag problems of ``argv`` (none: an empty list)."""
    try:
        RunConfig.from_namespace(build_parser().parse_args(argv))
    except FlagError as error:
        return error.problems
    return []


def test_a_masked_run_with_the_mask_column_parses_with_its_weight():
    config = parse_args([*MASKED, "--unmasked_weight", "0.25"])
    assert config.masked_loss.masked_loss and config.masked_loss.weight == 0.25
    assert parse_args(MASKED).masked_loss.weight == 0.0  # unset: black is ignored
    assert not parse_args(VALID).masked_loss.masked_loss


@pytest.mark.parametrize("value", ["-0.1", "1.5"])
def test_the_weight_lies_between_zero_and_one(value):
    [problem] = problems([*MASKED, "--unmasked_weight", value])
    assert f"--unmasked_weight {float(value)} must lie between 0" in problem and "--unmasked_weight 0.1" in problem


def test_a_weight_without_masked_loss_is_refused():
    [problem] = problems([*VALID, "--unmasked_weight", "0.5"])
    assert "--unmasked_weight 0.5 has no effect without --masked_loss" in problem


def test_masked_loss_needs_the_mask_column_loaded():
    [problem] = problems([*VALID, "--masked_loss"])
    assert "--masked_loss reads each row's mask from the metadata column 'mask'" in problem
    assert "--data_file_keys image,video,mask" in problem


def test_a_loaded_mask_column_without_masked_loss_is_refused():
    [problem] = problems([*VALID, "--data_file_keys", "image,mask"])
    assert "without --masked_loss the masks would be ignored" in problem and "add --masked_loss" in problem


def test_stage_one_caches_the_masks_and_leaves_the_weight_to_stage_two():
    assert problems([*MASKED, "--task", "sft:data_process"]) == []
    [problem] = problems([*MASKED, "--task", "sft:data_process", "--unmasked_weight", "0.2"])
    assert "has no effect on --task sft:data_process" in problem and "sft:train" in problem
    stage_two = [flag for flag in VALID if flag not in ("--dataset_metadata_path", "data/metadata.csv")]
    # Stage 2 reads the masks from the cache: --data_file_keys does not matter there.
    assert problems([*stage_two, "--dataset_base_path", "cache", "--task", "sft:train", "--masked_loss",
                     "--unmasked_weight", "0.2"]) == []
