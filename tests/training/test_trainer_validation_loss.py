"""The validation loss (``--validation_dataset_metadata_path``, ``--validation_loss_steps``) on the tiny Qwen-Image:
fixed draws, the metrics.csv column, training unchanged, split training and offload, and bad input."""

import csv
import shutil

import pytest
import torch

from diffsynth.core.data import UnifiedDataset
from diffsynth.core.data.example_dataset import build_example_dataset
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.training.config.errors import FlagError
from diffsynth.training.entry import main
from diffsynth.training.loop.validation_loss import ValidationLoss, mean_loss, sample_losses, validation_generator
from tests.training.conftest import lora, max_difference, run_once
from tests.training.test_trainer import COMMON, PATTERN, raw

STEPS = ["--dataset_repeat", "3", "--num_epochs", "1"]  # 3 images x 3: 9 optimizer steps


@pytest.fixture(autouse=True)
def in_process_runs(base, fresh_accelerate_state):
    """Every test here runs the trainer in-process on the tiny repos."""


@pytest.fixture(scope="module")
def validation(tmp_path_factory):
    """A two-image validation set of its own folder (the training set's columns)."""
    folder = tmp_path_factory.mktemp("validation")
    build_example_dataset(folder, num_images=2)
    return folder


def validation_flags(validation, steps="4"):
    return ["--validation_dataset_metadata_path", str(validation / "metadata.csv"), "--validation_dataset_base_path",
            str(validation), *(["--validation_loss_steps", steps] if steps else [])]


def train(dataset, output, *extra):
    return main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(output), *STEPS, "--enable_csv_log",
                                    *extra])


def metrics(output):
    with open(output / "logs" / "metrics.csv", newline="", encoding="utf-8") as file:
        return list(csv.DictReader(file))


def val_column(output):
    """``{step: val_loss}`` of the rows that hold one."""
    return {int(row["step"]): float(row["val_loss"]) for row in metrics(output) if row["val_loss"]}


@pytest.fixture(scope="module")
def measured(dataset, validation, tmp_path_factory, tiny_root):
    """Plain one-stage training with a validation loss every 4 steps."""
    return run_once(tiny_root, tmp_path_factory.mktemp("measured"),
                    lambda output: train(dataset, output, *validation_flags(validation)))


def test_val_loss_is_a_column_from_the_first_row_with_values_every_n_steps_and_at_the_end(measured):
    output, result = measured
    rows = metrics(output)
    assert result["global_step"] == 9 and len(rows) == 9
    assert list(rows[0]) == ["step", "loss", "lr", "nonfinite_steps", "val_loss"] and rows[0]["val_loss"] == ""
    values = val_column(output)
    assert sorted(values) == [4, 8, 9]
    assert [step for step, _ in result["val_losses"]] == [4, 8, 9]
    assert values == pytest.approx(dict(result["val_losses"]), rel=1e-6)  # the CSV's text holds %g-like floats
    assert all(value > 0 for value in values.values())


def test_training_with_a_validation_loss_trains_the_same_lora(measured, dataset, tmp_path):
    output, _ = measured
    train(dataset, tmp_path / "plain")
    assert max_difference(lora(output, "epoch-0"), lora(tmp_path / "plain", "epoch-0")) == 0.0
    assert "val_loss" not in metrics(tmp_path / "plain")[0]


def test_the_last_value_is_the_mean_loss_at_the_fixed_draws_and_repeats_exactly(measured, validation):
    output, result = measured
    module = result["module"]
    module.requires_grad_(False)
    samples = UnifiedDataset(validation, validation / "metadata.csv", max_pixels=4096)
    samples.use_size_multiple(module.pipe.size_multiple())
    with torch.no_grad():  # independently: the module's loss of each sample at its validation draws
        independent = [module([samples[index]], generators=[validation_generator(index)]).item()
                       for index in range(len(samples))]
    assert val_column(output)[9] == pytest.approx(sum(independent) / len(independent), rel=1e-5)
    first, second = (sample_losses(module, module, samples) for _ in range(2))
    assert torch.equal(first, second)  # the same weights give the same value
    # Two processes' shares add up to one process's vector exactly: the value does not depend on the count.
    shares = sample_losses(module, module, samples, 0, 2) + sample_losses(module, module, samples, 1, 2)
    assert torch.equal(shares, first) and mean_loss(shares) == mean_loss(first)
    assert mean_loss(first) == pytest.approx(result["val_losses"][-1][1], rel=1e-5)


def test_validation_generators_depend_on_the_index_alone():
    assert torch.equal(torch.rand(4, generator=validation_generator(3)),
                       torch.rand(4, generator=validation_generator(3)))
    assert not torch.equal(torch.rand(4, generator=validation_generator(3)),
                           torch.rand(4, generator=validation_generator(4)))
    loss = ValidationLoss([], steps=4)
    assert [step for step in range(1, 10) if loss.due(step, 9)] == [4, 8, 9]
    assert [step for step in range(1, 10) if ValidationLoss([], None).due(step, 9)] == [9]


def test_a_set_without_steps_is_measured_at_the_end_only(dataset, validation, tmp_path):
    train(dataset, tmp_path / "out", *validation_flags(validation, steps=None))
    assert sorted(val_column(tmp_path / "out")) == [9]


def test_offloaded_training_measures_the_plain_val_loss(measured, dataset, validation, tmp_path):
    output, _ = measured
    train(dataset, tmp_path / "offload", *validation_flags(validation), "--enable_model_cpu_offload")
    offloaded, plain = val_column(tmp_path / "offload"), val_column(output)
    assert sorted(offloaded) == sorted(plain)
    assert all(offloaded[step] == pytest.approx(plain[step], rel=1e-4) for step in plain)


def test_split_training_caches_the_validation_set_and_measures_the_one_stage_val_loss(measured, dataset, validation,
                                                                                        tmp_path):
    output, _ = measured
    cache = tmp_path / "cache"
    main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(cache), "--task", "sft:data_process",
                             "--offload_models", PATTERN["dit"], *validation_flags(validation, steps=None)])
    assert (cache / "validation" / "cache_info.json").is_file()
    assert len(list((cache / "validation").glob("*/*.safetensors"))) == 2
    main(QwenImagePipeline, ["--dataset_base_path", str(cache), *COMMON, "--output_path", str(tmp_path / "out"),
                             "--task", "sft:train", *STEPS, "--enable_csv_log", "--offload_models",
                             f"{PATTERN['text_encoder']},{PATTERN['vae']}", "--validation_loss_steps", "4"])
    split, plain = val_column(tmp_path / "out"), val_column(output)
    assert sorted(split) == [4, 8, 9]
    assert all(split[step] == pytest.approx(plain[step], rel=1e-4) for step in plain)


# ---- bad input: refused before training ----------------------------------------------------------------------------


def refused(dataset, tmp_path, *flags, task=None):
    argv = [*raw(dataset), *COMMON, "--output_path", str(tmp_path / "out"), *STEPS, *flags]
    if task is not None:
        argv += ["--task", task]
    with pytest.raises(FlagError) as error:
        main(QwenImagePipeline, argv)
    assert not (tmp_path / "out" / "logs" / "metrics.csv").exists()
    return str(error.value)


def flag_error(capsys, argv):
    """The message of flags refused while they are parsed (exit status 2, as argparse's)."""
    with pytest.raises(SystemExit):
        main(QwenImagePipeline, argv)
    return capsys.readouterr().err


def test_steps_without_a_set_are_refused(dataset, tmp_path, capsys):
    message = flag_error(capsys, [*raw(dataset), *COMMON, "--output_path", str(tmp_path / "out"),
                                  "--validation_loss_steps", "5"])
    assert "--validation_loss_steps 5 without a validation set" in message
    assert "--validation_dataset_metadata_path FILE" in message


def test_a_missing_validation_metadata_file_is_refused(dataset, tmp_path):
    message = refused(dataset, tmp_path, "--validation_dataset_metadata_path", str(tmp_path / "nope.csv"),
                      "--validation_loss_steps", "5")
    assert f"--validation_dataset_metadata_path {tmp_path / 'nope.csv'} does not exist" in message


def test_an_empty_validation_set_is_refused(dataset, tmp_path):
    (tmp_path / "empty.csv").write_text("image,prompt\n")
    message = refused(dataset, tmp_path, "--validation_dataset_metadata_path", str(tmp_path / "empty.csv"),
                      "--validation_dataset_base_path", str(dataset), "--validation_loss_steps", "5")
    assert f"--validation_dataset_metadata_path {tmp_path / 'empty.csv'}" in message and "has no rows" in message


def test_a_validation_set_without_the_training_columns_is_refused(dataset, validation, tmp_path):
    folder = tmp_path / "set"
    shutil.copytree(validation, folder)
    (folder / "metadata.csv").write_text("image,caption\n" + "".join(
        f"{row['image']},a caption\n" for row in csv.DictReader(open(validation / "metadata.csv"))))
    message = refused(dataset, tmp_path, *validation_flags(folder))
    assert "--validation_dataset_metadata_path" in message and "'prompt'" in message
    assert "columns the training set has" in message


def test_stages_refuse_the_flags_they_do_not_read(dataset, validation, tmp_path, capsys):
    message = flag_error(capsys, [*raw(dataset), *COMMON, "--output_path", str(tmp_path / "out"), "--task",
                                  "sft:data_process", *validation_flags(validation)])
    assert "--validation_loss_steps 4 has no effect on --task sft:data_process" in message
    message = flag_error(capsys, ["--dataset_base_path", str(dataset), *COMMON, "--output_path", str(tmp_path / "o"),
                                  "--task", "sft:train", *validation_flags(validation)])
    assert "reads the validation set from the stage-1 cache" in message


def test_split_training_without_a_cached_validation_set_is_refused(dataset, tmp_path):
    cache = tmp_path / "cache"
    main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(cache), "--task", "sft:data_process",
                             "--offload_models", PATTERN["dit"]])
    with pytest.raises(FlagError, match="holds no cached validation set"):
        main(QwenImagePipeline, ["--dataset_base_path", str(cache), *COMMON, "--output_path", str(tmp_path / "out"),
                                 "--task", "sft:train", "--validation_loss_steps", "4"])
    assert not (tmp_path / "out" / "logs").exists()
