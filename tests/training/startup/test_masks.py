"""The start-up check of a dataset's masks: a masked run needs one, an unmasked run with a mask column warns."""

import logging

import pytest
from PIL import Image

from diffsynth.core.data import UnifiedDataset
from diffsynth.pipelines.ltx2.pipeline import LTX2AudioVideoPipeline
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.training.config import parse_args
from diffsynth.training.config.errors import FlagError
from diffsynth.training.startup.masks import check_dataset_masks, optional_file_columns

MODEL = ["--model_id_with_origin_paths", "Qwen/Qwen-Image:transformer/*.safetensors", "--lora_base_model", "dit"]


@pytest.fixture
def folder(tmp_path):
    Image.new("RGB", (32, 32), "red").save(tmp_path / "a.png")
    Image.new("L", (32, 32), 255).save(tmp_path / "a_mask.png")
    return tmp_path


def run(folder, rows, *flags):
    (folder / "metadata.csv").write_text("image,mask,prompt\n" + "\n".join(rows) + "\n")
    config = parse_args([*MODEL, "--dataset_base_path", str(folder), "--dataset_metadata_path",
                         str(folder / "metadata.csv"), *flags])
    keys = config.dataset.file_keys
    dataset = UnifiedDataset(folder, folder / "metadata.csv", data_file_keys=keys,
                             optional_file_keys=optional_file_columns(config))
    return config, dataset


def test_a_masked_run_without_any_mask_is_refused(folder):
    config, dataset = run(folder, ["a.png,,a red square"], "--masked_loss", "--data_file_keys", "image,mask")
    with pytest.raises(FlagError, match="no row of metadata .* has a mask"):
        check_dataset_masks(config, dataset, QwenImagePipeline)
    check_dataset_masks(config, dataset, QwenImagePipeline, require_one=False)  # a validation set may have none


def test_a_masked_run_counts_its_masked_rows(folder, caplog):
    config, dataset = run(folder, ["a.png,a_mask.png,a", "a.png,,b"], "--masked_loss", "--data_file_keys",
                          "image,mask")
    with caplog.at_level(logging.INFO):
        check_dataset_masks(config, dataset, QwenImagePipeline)
    assert "1 of 2 rows have a mask" in caplog.text


def test_an_unused_mask_column_warns_naming_the_flags(folder, caplog):
    config, dataset = run(folder, ["a.png,a_mask.png,a"])
    assert optional_file_columns(config) == ()
    check_dataset_masks(config, dataset, QwenImagePipeline)
    assert "has a 'mask' column, which this run does not use" in caplog.text and "--masked_loss" in caplog.text


def test_a_masked_run_of_packed_audio_video_tokens_is_refused_naming_the_flag(folder):
    config, dataset = run(folder, ["a.png,a_mask.png,a"], "--masked_loss", "--data_file_keys", "image,mask")
    with pytest.raises(FlagError, match="--masked_loss: LTX2AudioVideoPipeline .* drop --masked_loss"):
        check_dataset_masks(config, dataset, LTX2AudioVideoPipeline)
