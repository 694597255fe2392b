"""The trainer on several datasets (a config file's ``datasets:``) and regularization images, on the tiny Qwen-Image:
two datasets of different resolutions train and write a LoRA; regularization rows make half of each epoch, their
loss is weighted by --prior_loss_weight (0: they change nothing) and logged as loss_prior; split training caches every
dataset and trains what one stage trains; a resumed run continues the same order; bad entries are refused before any
model loads (issue 47)."""

import csv
import json
import math

import pytest
import yaml

from diffsynth.core.data.example_dataset import build_example_dataset
from diffsynth.core.data.mix import MIX_MANIFEST_FILE
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.training.config.errors import FlagError
from diffsynth.training.config.files import read_config_file
from diffsynth.training.config.parsers import build_parser
from diffsynth.training.entry import main
from tests.conftest import reset_accelerate_state
from tests.training.conftest import lora, max_difference, run_once
from tests.training.test_trainer import COMMON, launch_two_processes
from tests.training.test_trainer_resume import refuse_to_load

# A: 3 images at a fixed 32x32, read twice an epoch; B: 2 images sized by a smaller pixel budget; 8 training draws.
TRAINING_DRAWS = 3 * 2 + 2


@pytest.fixture(autouse=True)
def in_process_runs(base, fresh_accelerate_state):
    """Every test here runs the trainer in-process on the tiny repos."""


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("datasets")
    for name, count, seed in (("a", 3, 1), ("b", 2, 2), ("reg", 2, 3), ("other_reg", 2, 4)):
        build_example_dataset(root / name, num_images=count, seed=seed)
    return root


def write_config(path, folders, reg="reg", b_size=(("max_pixels", 2048),), **flags):
    """A config file of datasets A and B (B sized by ``b_size``; ``reg`` as regularization images, unless None) plus
    ``flags``."""
    config = {"datasets": [
        {"metadata_path": str(folders / "a" / "metadata.csv"), "base_path": str(folders / "a"), "repeats": 2,
         "height": 32, "width": 32},
        {"metadata_path": str(folders / "b" / "metadata.csv"), "base_path": str(folders / "b"), **dict(b_size)},
    ], **flags}
    if reg is not None:
        config.update(reg_dataset_metadata_path=str(folders / reg / "metadata.csv"),
                      reg_dataset_base_path=str(folders / reg))
    path.write_text(yaml.safe_dump(config))
    return path


def run(config, output, *extra):
    reset_accelerate_state()
    return main(QwenImagePipeline, ["--config", str(config), *COMMON, "--output_path", str(output),
                                    "--num_epochs", "1", "--enable_csv_log", *extra])


@pytest.fixture(scope="module")
def reference(folders, tmp_path_factory, tiny_root):
    """One-stage training on A, B and the regularization images, weighted 0.5."""
    folder = tmp_path_factory.mktemp("reference")
    config = write_config(folder / "run.yaml", folders, prior_loss_weight=0.5)
    return run_once(tiny_root, folder, lambda output: run(config, output))


def metric_column(output, name):
    with open(output / "logs" / "metrics.csv", newline="", encoding="utf-8") as handle:
        return [row[name] for row in csv.DictReader(handle)]


def test_two_datasets_and_regularization_images_train_and_log_loss_prior(reference):
    output, result = reference
    # Kohya's proportion: as many regularization draws as training draws, one sample a step.
    assert result["global_step"] == 2 * TRAINING_DRAWS and (output / "epoch-0.safetensors").is_file()
    prior = metric_column(output, "loss_prior")
    values = [float(cell) for cell in prior if cell]
    assert len(values) == TRAINING_DRAWS and all(math.isfinite(value) and value > 0 for value in values)
    # The resolved config lists the datasets again, and reads back.
    written = read_config_file(output / "config.yaml", build_parser())
    assert [entry.get("repeats", 1) for entry in written["datasets"]] == [2, 1]
    assert written["prior_loss_weight"] == 0.5


def test_split_training_caches_every_dataset_and_gives_the_one_stage_lora(reference, folders, tmp_path):
    config = write_config(tmp_path / "stage1.yaml", folders)
    cache = tmp_path / "cache"
    assert run(config, cache, "--task", "sft:data_process")["cached"] == 3 + 2 + 2
    recorded = json.loads((cache / MIX_MANIFEST_FILE).read_text())["datasets"]
    assert [(entry["repeats"], entry["is_reg"]) for entry in recorded] == [(2, False), (1, False), (1, True)]
    counts = [len(list((cache / "datasets" / str(number)).glob("*/*.safetensors"))) for number in range(3)]
    assert counts == [3, 2, 2]
    # A rerun into the same folder continues the caches: nothing left to compute.
    assert run(config, cache, "--task", "sft:data_process")["cached"] == 0
    # Stage 2 reads the datasets, repeats and regularization marks from the cache.
    stage_two = tmp_path / "stage2.yaml"
    stage_two.write_text(yaml.safe_dump({"dataset_base_path": str(cache), "prior_loss_weight": 0.5}))
    result = run(stage_two, tmp_path / "out", "--task", "sft:train")
    assert result["global_step"] == 2 * TRAINING_DRAWS
    assert max_difference(lora(tmp_path / "out", "epoch-0"), lora(reference[0], "epoch-0")) < 1e-6


def test_a_resumed_run_continues_the_same_order(reference, folders, tmp_path):
    config = write_config(tmp_path / "run.yaml", folders, prior_loss_weight=0.5)
    output = tmp_path / "out"
    assert run(config, output, "--max_train_steps", "5")["global_step"] == 5
    resumed = run(config, output, "--resume_from_checkpoint", "latest")
    assert resumed["global_step"] == 2 * TRAINING_DRAWS
    assert resumed["losses"] == pytest.approx(reference[1]["losses"][5:], abs=1e-6)
    assert max_difference(lora(output, "epoch-0"), lora(reference[0], "epoch-0")) < 1e-6


def test_a_prior_loss_weight_of_zero_leaves_the_regularization_images_out(reference, folders, tmp_path):
    # Other regularization images, same count and sizes: weighted 0, they must not change a single weight.
    first = write_config(tmp_path / "first.yaml", folders, prior_loss_weight=0.0)
    second = write_config(tmp_path / "second.yaml", folders, reg="other_reg", prior_loss_weight=0.0)
    run(first, tmp_path / "first")
    run(second, tmp_path / "second")
    assert max_difference(lora(tmp_path / "first", "epoch-0"), lora(tmp_path / "second", "epoch-0")) == 0
    assert max_difference(lora(tmp_path / "first", "epoch-0"), lora(reference[0], "epoch-0")) > 1e-6
    # Their loss is still measured and logged.
    assert len([cell for cell in metric_column(tmp_path / "second", "loss_prior") if cell]) == TRAINING_DRAWS


def test_batches_of_several_datasets_share_buckets(folders, tmp_path):
    config = write_config(tmp_path / "run.yaml", folders, reg=None, b_size=(("height", 16), ("width", 48)))
    # A's 6 draws at 32x32 give 3 batches of 2, B's 2 draws at 48x16 one: a batch never mixes the two sizes.
    result = run(config, tmp_path / "out", "--batch_size", "2")
    assert result["global_step"] == 4 and (tmp_path / "out" / "epoch-0.safetensors").is_file()


def test_bad_entries_are_refused_before_any_model_loads(folders, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("diffsynth.training.entry.load_pipeline", refuse_to_load)
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump({"datasets": [
        {"metadata_path": str(folders / "a" / "metadata.csv"), "num_repeats": 2},
        {"metadata_path": str(folders / "b" / "metadata.csv"), "repeats": 0},
    ]}))
    with pytest.raises(SystemExit):
        run(config, tmp_path / "out")
    error = capsys.readouterr().err
    assert "datasets[0]: unknown key 'num_repeats'; did you mean repeats?" in error
    assert "datasets[1].repeats 0 must be at least 1" in error
    missing = write_config(tmp_path / "missing.yaml", folders)
    text = yaml.safe_load(missing.read_text())
    text["datasets"][1]["metadata_path"] = str(tmp_path / "nowhere.csv")
    missing.write_text(yaml.safe_dump(text))
    with pytest.raises(FlagError, match=r"datasets\[1\]: the metadata file .*nowhere.csv does not exist"):
        run(missing, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_two_processes_share_the_mix_as_one_process_accumulating_two(folders, tmp_path, tiny_root):
    """Each process takes every other batch of the mix, weighted as one process takes them; loss_prior's all-reduce
    runs on both."""
    config = write_config(tmp_path / "run.yaml", folders, prior_loss_weight=0.5)
    flags = ["--config", str(config), *COMMON, "--num_epochs", "1", "--enable_csv_log"]
    _, first, second = launch_two_processes(tmp_path, tiny_root, flags, tmp_path / "two")
    assert max_difference(first, second) == 0
    single = main(QwenImagePipeline, [*flags, "--gradient_accumulation_steps", "2", "--output_path",
                                      str(tmp_path / "one")])
    assert single["global_step"] == TRAINING_DRAWS
    assert max_difference(lora(tmp_path / "two", "epoch-0"), lora(tmp_path / "one", "epoch-0")) < 1e-6
    two, one = metric_column(tmp_path / "two", "loss_prior"), metric_column(tmp_path / "one", "loss_prior")
    assert [cell == "" for cell in two] == [cell == "" for cell in one]
    assert [float(cell) for cell in two if cell] == pytest.approx([float(cell) for cell in one if cell], abs=1e-6)
