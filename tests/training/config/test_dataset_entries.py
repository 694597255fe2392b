"""A config file's ``datasets:`` list and the regularization flags: entries read from YAML and TOML, their unset
values taken from the run's flags, and every bad entry or flag refused at once, naming the key or flag, the value
and the fix (issue 47)."""

import sys

import pytest
import yaml

from diffsynth.training.config.dataset_entries import DatasetEntry, parse_entries
from diffsynth.training.config.parsers import parse_args
from tests.training.config.test_parsers import STAGE_TWO, VALID

MODEL = VALID[:4]  # the model and LoRA flags of VALID, without its dataset


def config_file(tmp_path, content, suffix=".yaml"):
    path = tmp_path / f"run{suffix}"
    path.write_text(yaml.safe_dump(content) if suffix == ".yaml" else content)
    return str(path)


def errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_entries_take_the_flags_they_leave_unset(tmp_path):
    path = config_file(tmp_path, {"datasets": [
        {"metadata_path": "a/metadata.csv", "repeats": 3, "height": 512, "width": 768},
        {"metadata_path": "b/metadata.csv", "base_path": "b", "max_pixels": 65536, "data_file_keys": ["image"]},
        {"metadata_path": "reg/metadata.csv", "is_reg": True},
    ]})
    config = parse_args(["--config", path, *MODEL, "--dataset_base_path", "a", "--height", "256", "--width", "256"])
    first, second, reg = config.dataset.entries()
    assert (first.base_path, first.repeats, first.height, first.width) == ("a", 3, 512, 768)
    # An entry sized by its own pixel budget is not held to the run's fixed --height/--width.
    assert (second.base_path, second.height, second.max_pixels, second.file_keys) == ("b", None, 65536, ["image"])
    assert (reg.is_reg, reg.height, reg.width, reg.data_file_keys) == (True, 256, 256, "image,video")
    assert config.dataset.mixed and config.dataset.flags()["datasets"][0] == {
        "metadata_path": "a/metadata.csv", "repeats": 3, "height": 512, "width": 768}


@pytest.mark.skipif(sys.version_info < (3, 11), reason="reading TOML needs Python 3.11's tomllib")
def test_toml_arrays_of_tables_are_datasets(tmp_path):
    path = config_file(tmp_path, '[[datasets]]\nmetadata_path = "a.csv"\nrepeats = 2\n\n[[datasets]]\n'
                                 'metadata_path = "r.csv"\nis_reg = true\n', suffix=".toml")
    entries = parse_args(["--config", path, *MODEL]).dataset.datasets
    assert entries == (DatasetEntry("a.csv", repeats=2), DatasetEntry("r.csv", is_reg=True))


def test_the_regularization_flags_make_a_regularization_dataset():
    config = parse_args([*VALID, "--reg_dataset_metadata_path", "reg.csv", "--prior_loss_weight", "0.25"])
    assert config.dataset.mixed and config.dataset.prior_loss_weight == 0.25
    train, reg = config.dataset.entries()
    assert (train.metadata_path, train.is_reg) == ("data/metadata.csv", False)
    # The regularization images' folder defaults to --dataset_base_path, as the validation set's does.
    assert (reg.metadata_path, reg.base_path, reg.is_reg) == ("reg.csv", "", True)
    assert not parse_args(VALID).dataset.mixed and "datasets" not in parse_args(VALID).dataset.flags()


def test_every_bad_entry_is_named_at_once(tmp_path, capsys):
    path = config_file(tmp_path, {"datasets": [
        {"metadat_path": "a.csv", "num_repeats": 2},
        {"metadata_path": "b.csv", "repeats": 0, "height": 500},
        {"metadata_path": "c.csv", "is_reg": "yes", "max_pixels": 100},
        "d.csv",
    ]})
    error = errors(["--config", path, *MODEL], capsys)
    for fragment in ("datasets[0]: unknown key 'metadat_path'; did you mean metadata_path?",
                     "datasets[0]: unknown key 'num_repeats'; did you mean repeats?",
                     "datasets[0] has no metadata_path",
                     "datasets[1].repeats 0 must be at least 1", "datasets[1] gives height without width",
                     "datasets[1].height 500 must be a positive multiple of 16; write e.g. height: 496",
                     "datasets[2].is_reg is 'yes', not true or false",
                     "datasets[3] holds 'd.csv', not a mapping"):
        assert fragment in error
    assert "datasets[2].max_pixels" not in error  # reported once the entry's types are right


def test_num_frames_is_a_key_of_the_video_trainer_only(tmp_path, capsys):
    path = config_file(tmp_path, {"datasets": [{"metadata_path": "a.csv", "num_frames": 49}]})
    assert parse_args(["--config", path, *MODEL], video=True).dataset.entries()[0].num_frames == 49
    assert "datasets[0]: unknown key 'num_frames'" in errors(["--config", path, *MODEL], capsys)
    assert parse_entries([{"metadata_path": "a.csv", "num_frames": 50}])[1] == [
        "datasets[0].num_frames 50 must be 4k+1 (e.g. 49 or 81)"]


@pytest.mark.parametrize("extra, fragment", [
    (["--prior_loss_weight", "-0.5", "--reg_dataset_metadata_path", "r.csv"],
     "--prior_loss_weight -0.5 must be at least 0.0; pass e.g. --prior_loss_weight 1.0"),
    (["--prior_loss_weight", "0.5"], ("--prior_loss_weight 0.5 has no effect without regularization images; add "
                                     "--reg_dataset_metadata_path")),
    (["--reg_dataset_base_path", "reg"], ("--reg_dataset_base_path reg has no effect without "
                                         "--reg_dataset_metadata_path")),
    (["--reg_dataset_metadata_path", "r.csv", "--prior_loss_weight", "0.5", "--task", "sft:data_process"],
     "--prior_loss_weight 0.5 has no effect on --task sft:data_process"),
])
def test_bad_regularization_flags_name_flag_value_and_fix(extra, fragment, capsys):
    assert fragment in errors([*VALID, *extra], capsys)


def test_stage_two_reads_datasets_and_regularization_rows_from_the_cache(tmp_path, capsys):
    error = errors([*STAGE_TWO, "--dataset_base_path", "cache", "--task", "sft:train",
                    "--reg_dataset_metadata_path", "r.csv"], capsys)
    assert "--reg_dataset_metadata_path r.csv: --task sft:train reads the stage-1 cache" in error
    # There, --prior_loss_weight weights the cache's regularization rows: no regularization flag is needed.
    stage_two = parse_args([*STAGE_TWO, "--dataset_base_path", "cache", "--task", "sft:train",
                            "--prior_loss_weight", "0.5"])
    assert stage_two.dataset.prior_loss_weight == 0.5


def test_datasets_replace_the_metadata_flag(tmp_path, capsys):
    path = config_file(tmp_path, {"datasets": [{"metadata_path": "a.csv"}]})
    assert "--dataset_metadata_path data/metadata.csv and the config file's datasets: list both" in errors(
        ["--config", path, *VALID], capsys)
    only_reg = config_file(tmp_path, {"datasets": [{"metadata_path": "r.csv", "is_reg": True}]})
    assert "every entry has is_reg: true" in errors(["--config", only_reg, *MODEL], capsys)
