"""Batches through the CLI trainer on the tiny Qwen-Image: a batch of B trains what B micro-steps of gradient
accumulation at batch 1 train on the same samples (prompts of different lengths padded with a mask), one-stage and
two-stage; several buckets; the placement modes; resuming."""

import logging
import random

import pytest

from diffsynth.core.data.example_dataset import draw_example
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.training.entry import main
from tests.training.conftest import lora, max_difference
from tests.training.test_trainer import COMMON, PATTERN, raw

# Float differences between a batched and an unbatched forward pass, carried through a few Adam steps.
TOLERANCE = 2e-5


@pytest.fixture(autouse=True)
def in_process_runs(base, fresh_accelerate_state):
    """Every test here runs the trainer in-process on the tiny repos."""


def write_same_ratio_dataset(folder, sizes=((96, 64), (150, 100), (192, 128), (240, 160))):
    """Images of one aspect ratio (3:2) but different sizes and captions of different lengths: one bucket."""
    folder.mkdir(parents=True, exist_ok=True)
    rng, rows = random.Random(7), ["image,prompt"]
    for index, size in enumerate(sizes):
        image, caption = draw_example(rng, index)
        image.convert("RGB").resize(size).save(folder / f"{index}.png")
        rows.append(f'{index}.png,"{caption}{" in detail" * index}"')
    (folder / "metadata.csv").write_text("\n".join(rows) + "\n")
    return folder


@pytest.fixture(scope="module")
def same_ratio(tmp_path_factory):
    return write_same_ratio_dataset(tmp_path_factory.mktemp("same_ratio"))


def train(dataset, output, *extra):
    return main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(output), "--num_epochs", "1",
                                    "--dataset_repeat", "2", *extra])


def cache_then_train(dataset, output, stage_one_flags, *extra):
    cache = output.parent / f"{output.name}_cache"
    main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(cache), "--task", "sft:data_process",
                             "--offload_models", PATTERN["dit"], *stage_one_flags])
    return main(QwenImagePipeline, ["--dataset_base_path", str(cache), *COMMON, "--output_path", str(output),
                                    "--task", "sft:train", "--num_epochs", "1", "--dataset_repeat", "2", *extra])


@pytest.fixture(scope="module")
def accumulated(same_ratio, tmp_path_factory, tiny_root):
    """Batch 1 accumulating 2 micro-steps per optimizer step, at the bucket sizes: what batch 2 must reproduce."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        output = tmp_path_factory.mktemp("accumulated") / "out"
        result = train(same_ratio, output, "--aspect_ratio_buckets", "--gradient_accumulation_steps", "2")
    from tests.conftest import reset_accelerate_state

    reset_accelerate_state()
    return output, result


def test_a_batch_trains_what_accumulating_its_samples_trains(accumulated, same_ratio, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="diffsynth.training.objective.batches"):
        batched = train(same_ratio, tmp_path / "batched", "--batch_size", "2")
    assert batched["global_step"] == accumulated[1]["global_step"] == 4
    assert batched["losses"] == pytest.approx(accumulated[1]["losses"], abs=TOLERANCE)
    assert max_difference(lora(tmp_path / "batched", "epoch-0"), lora(accumulated[0], "epoch-0")) < TOLERANCE
    assert "8 samples in 1 bucket, batch size 2, 4 batches per epoch" in caplog.text


def test_two_stage_batches_train_what_one_stage_batches_train(accumulated, same_ratio, tmp_path):
    two = cache_then_train(same_ratio, tmp_path / "two", ["--batch_size", "2"], "--batch_size", "2")
    assert two["losses"] == pytest.approx(accumulated[1]["losses"], abs=TOLERANCE)
    assert max_difference(lora(tmp_path / "two", "epoch-0"), lora(accumulated[0], "epoch-0")) < TOLERANCE


def test_several_buckets_batch_alike_in_one_and_two_stages(dataset, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="diffsynth.training.objective.batches"):
        one = train(dataset, tmp_path / "one", "--batch_size", "2")
    # Three images of three aspect ratios, each twice: three buckets of two.
    assert "6 samples in 3 buckets, batch size 2, 3 batches per epoch" in caplog.text
    assert one["global_step"] == 3
    two = cache_then_train(dataset, tmp_path / "two", ["--batch_size", "2"], "--batch_size", "2")
    assert two["losses"] == pytest.approx(one["losses"], abs=1e-6)
    assert max_difference(lora(tmp_path / "one", "epoch-0"), lora(tmp_path / "two", "epoch-0")) < 1e-6


@pytest.mark.parametrize("mode", [["--enable_model_cpu_offload"], ["--blocks_to_swap", "1"],
                                  ["--blocks_to_swap", "2", "--block_swap_h2d_only"]])
def test_batches_train_alike_under_offload_and_block_swap(dataset, tmp_path, mode):
    plain = train(dataset, tmp_path / "plain", "--batch_size", "2", "--num_epochs", "1")
    placed = train(dataset, tmp_path / "placed", "--batch_size", "2", *mode)
    assert placed["losses"] == pytest.approx(plain["losses"], abs=1e-6)
    assert max_difference(lora(tmp_path / "plain", "epoch-0"), lora(tmp_path / "placed", "epoch-0")) < 1e-6


def test_a_resumed_batched_run_ends_where_an_uninterrupted_one_does(dataset, tmp_path):
    whole = train(dataset, tmp_path / "whole", "--batch_size", "2", "--num_epochs", "2")
    stopped = train(dataset, tmp_path / "out", "--batch_size", "2", "--num_epochs", "2", "--max_train_steps", "4")
    assert stopped["global_step"] == 4
    resumed = train(dataset, tmp_path / "out", "--batch_size", "2", "--num_epochs", "2", "--resume_from_checkpoint",
                    "latest")
    assert resumed["losses"] == pytest.approx(whole["losses"][4:], abs=1e-6)
    assert max_difference(lora(tmp_path / "out"), lora(tmp_path / "whole")) < 1e-6


def test_fp8_weights_and_gradient_checkpointing_train_batches(dataset, tmp_path):
    fp8 = ["--batch_size", "2", "--fp8_models", PATTERN["dit"]]
    plain = train(dataset, tmp_path / "fp8", *fp8)
    offloaded = train(dataset, tmp_path / "fp8_offload", *fp8, "--enable_model_cpu_offload")
    assert offloaded["losses"] == pytest.approx(plain["losses"], abs=1e-6)
    trained = lora(tmp_path / "fp8", "epoch-0")
    assert max(value.abs().max().item() for key, value in trained.items() if "lora_B" in key) > 1e-4
    assert max_difference(trained, lora(tmp_path / "fp8_offload", "epoch-0")) < 1e-6


def test_a_cache_made_without_buckets_is_warned_about_at_batch_size_two(dataset, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="diffsynth.training.objective.batches"):
        result = cache_then_train(dataset, tmp_path / "out", [], "--batch_size", "2", "--dataset_repeat", "1")
    # Three images of three sizes, cached at their own sizes: three batches of one.
    assert result["global_step"] == 3
    assert "3 of 3 samples sit in buckets smaller than --batch_size 2" in caplog.text
    assert "rerun stage 1 with --batch_size" in caplog.text
