"""Batches on the other models: Wan (text-to-video, and Wan2.2 TI2V with its first frame and 32-pixel buckets) and
Qwen-Image-Edit (edit images bucketed with the target), each against gradient accumulation at batch 1, one-stage and
two-stage."""

import json

import pytest
from PIL import Image

from diffsynth.core.data.example_dataset import build_example_video_dataset
from diffsynth.core.data.example_edit_dataset import build_example_edit_dataset
from diffsynth.testing.tiny_models import (
    QWEN_IMAGE_EDIT_2509_MODEL_ID,
    WAN22_TI2V_MODEL_ID,
    WAN22_TI2V_PATTERNS,
    WAN_MODEL_ID,
    WAN_PATTERNS,
)
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
from diffsynth.training.entry import main
from tests.training.conftest import lora, max_difference
from tests.training.test_trainer_edit import SHARED_MODELS, common, dit

TOLERANCE = 2e-5
WAN = {name: f"{WAN_MODEL_ID}:{WAN_PATTERNS[name]}" for name in ("dit", "text_encoder", "vae")}
TI2V = {name: f"{WAN22_TI2V_MODEL_ID}:{WAN22_TI2V_PATTERNS[name]}" for name in ("dit", "text_encoder", "vae")}
WAN_FLAGS = ["--lora_base_model", "dit", "--lora_target_modules", "q,k,v,o,ffn.0,ffn.2", "--lora_rank", "4",
             "--learning_rate", "1e-3", "--torch_dtype", "float32", "--seed", "5", "--num_frames", "5",
             "--num_epochs", "1", "--dataset_repeat", "2"]


@pytest.fixture(autouse=True)
def in_process_runs(base, fresh_accelerate_state, monkeypatch):
    """In-process runs on the tiny repos, with 64 x 64-pixel edit images (as the Edit trainer tests)."""
    monkeypatch.setattr(QwenImagePipeline, "edit_image_pixels", 64 * 64)
    monkeypatch.setattr(QwenImagePipeline, "edit_condition_pixels", 64 * 64)


def raw(metadata):
    return ["--dataset_base_path", str(metadata.parent), "--dataset_metadata_path", str(metadata)]


def wan(argv):
    return main(WanVideoPipeline, argv, video=True)


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """Two clips of one size (one bucket), captions of different lengths."""
    return build_example_video_dataset(tmp_path_factory.mktemp("videos"), num_videos=2, num_frames=6)


def test_wan_batches_train_what_accumulation_trains_in_one_and_two_stages(videos, tmp_path):
    models = ["--model_id_with_origin_paths", ",".join(WAN.values()), "--max_pixels", "4096"]
    argv = [*raw(videos), *WAN_FLAGS, *models]
    accumulated = wan([*argv, "--aspect_ratio_buckets", "--gradient_accumulation_steps", "2", "--output_path",
                       str(tmp_path / "accumulated")])
    batched = wan([*argv, "--batch_size", "2", "--output_path", str(tmp_path / "batched")])
    assert batched["global_step"] == accumulated["global_step"] == 2
    assert batched["losses"] == pytest.approx(accumulated["losses"], abs=TOLERANCE)
    reference = lora(tmp_path / "accumulated", "epoch-0")
    assert max_difference(lora(tmp_path / "batched", "epoch-0"), reference) < TOLERANCE
    offload = ["--enable_model_cpu_offload"]
    wan([*argv, *offload, "--batch_size", "2", "--task", "sft:data_process", "--output_path", str(tmp_path / "cache"),
         "--offload_models", WAN["dit"]])
    wan(["--dataset_base_path", str(tmp_path / "cache"), *WAN_FLAGS, *models, *offload, "--batch_size", "2",
         "--task", "sft:train", "--output_path", str(tmp_path / "two"), "--offload_models",
         f"{WAN['text_encoder']},{WAN['vae']}"])
    assert max_difference(lora(tmp_path / "two", "epoch-0"), reference) < TOLERANCE


def test_wan22_ti2v_batches_its_first_frames_in_buckets_of_32_pixels(videos, tmp_path):
    """The Wan2.2 VAE compresses 16x: buckets have sides of multiples of 32, and each sample's first frame is its
    first latent frame, at timestep 0 and outside the loss, in a batch as alone."""
    argv = [*raw(videos), *WAN_FLAGS, "--model_id_with_origin_paths", ",".join(TI2V.values()), "--max_pixels",
            str(64 * 96), "--extra_inputs", "input_image"]
    accumulated = wan([*argv, "--aspect_ratio_buckets", "--gradient_accumulation_steps", "2", "--output_path",
                       str(tmp_path / "accumulated")])
    batched = wan([*argv, "--batch_size", "2", "--output_path", str(tmp_path / "batched")])
    assert batched["losses"] == pytest.approx(accumulated["losses"], abs=TOLERANCE)
    assert max_difference(lora(tmp_path / "batched", "epoch-0"), lora(tmp_path / "accumulated", "epoch-0")) < TOLERANCE
    assert batched["module"].pipe.size_multiple() == 32


@pytest.fixture(scope="module")
def edits(tmp_path_factory):
    """Two 2509-style edits (two edit images each) brought to one bucket: targets 3:2, first edit images square,
    second 2:3, so the samples share their target's and their edit images' shapes; their prompts differ in length."""
    metadata = build_example_edit_dataset(tmp_path_factory.mktemp("edits"), num_samples=2, num_edit_images=2)
    rows = json.loads(metadata.read_text())
    for row in rows:
        sizes = [(row["image"], (96, 64)), (row["edit_image"][0], (72, 72)), (row["edit_image"][1], (48, 72))]
        for name, size in sizes:
            path = metadata.parent / name
            Image.open(path).convert("RGB").resize(size).save(path)
    return metadata


def test_edit_batches_train_what_accumulation_trains_in_one_and_two_stages(edits, tmp_path):
    argv = [*raw(edits), *common(QWEN_IMAGE_EDIT_2509_MODEL_ID), "--num_epochs", "1", "--dataset_repeat", "2"]
    accumulated = main(QwenImagePipeline, [*argv, "--aspect_ratio_buckets", "--gradient_accumulation_steps", "2",
                                           "--output_path", str(tmp_path / "accumulated")])
    batched = main(QwenImagePipeline, [*argv, "--batch_size", "2", "--output_path", str(tmp_path / "batched")])
    assert batched["global_step"] == accumulated["global_step"] == 2
    assert batched["losses"] == pytest.approx(accumulated["losses"], abs=TOLERANCE)
    reference = lora(tmp_path / "accumulated", "epoch-0")
    assert max_difference(lora(tmp_path / "batched", "epoch-0"), reference) < TOLERANCE
    main(QwenImagePipeline, [*argv, "--batch_size", "2", "--task", "sft:data_process", "--output_path",
                             str(tmp_path / "cache"), "--offload_models", dit(QWEN_IMAGE_EDIT_2509_MODEL_ID)])
    main(QwenImagePipeline, ["--dataset_base_path", str(tmp_path / "cache"), *common(QWEN_IMAGE_EDIT_2509_MODEL_ID),
                             "--num_epochs", "1", "--dataset_repeat", "2", "--batch_size", "2", "--task", "sft:train",
                             "--output_path", str(tmp_path / "two"), "--offload_models", ",".join(SHARED_MODELS)])
    assert max_difference(lora(tmp_path / "two", "epoch-0"), reference) < TOLERANCE
