"""Config files: ``--config`` reads YAML or TOML under the flags' names, the command line overrides it, every problem
is named, and the ``config.yaml`` a training run writes reruns it bit for bit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml

from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.training.config import RunConfig, build_parser, parse_args
from diffsynth.training.config.errors import FlagError
from diffsynth.training.config.files import read_config_file, save_run_config, write_config_file
from diffsynth.training.entry import main
from diffsynth.training.outputs.output_folder import RUN_CONFIG_FILE, TRAINING_OUTPUTS, previous_outputs
from tests.conftest import reset_accelerate_state
from tests.examples.test_scripts import launch_commands, trainer_argv
from tests.training.conftest import lora
from tests.training.test_trainer import COMMON, raw

REPO = Path(__file__).resolve().parents[3]
FLAGS = ["--model_paths", '["dit.safetensors"]', "--lora_base_model", "dit", "--dataset_metadata_path", "m.csv"]


def problems(path: Path, text: str | None = None) -> list[str]:
    """The problems ``read_config_file`` reports for ``path`` (written with ``text`` first, when given)."""
    if text is not None:
        path.write_text(text, encoding="utf-8")
    with pytest.raises(FlagError) as caught:
        read_config_file(path, build_parser())
    return caught.value.problems


def test_a_written_config_reads_back_as_the_same_run(tmp_path):
    config = parse_args([*FLAGS, "--learning_rate", "3e-5", "--max_grad_norm", "1", "--seed", "7",
                         "--mixed_precision", "no", "--shared_host_weights", "off", "--vram_budget", "24"])
    path = write_config_file(tmp_path / "run.yaml", config.to_flags(), "a header\nof two lines")
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# a header\n# of two lines\n")
    assert "learning_rate: 3.0e-05\n" in text and "height: null\n" in text and "mixed_precision: 'no'\n" in text
    assert parse_args(["--config", str(path)]) == config


def test_the_validation_loss_flags_travel_in_config_files(tmp_path):
    config = parse_args([*FLAGS, "--validation_dataset_metadata_path", "val.csv", "--validation_dataset_base_path",
                         "val", "--validation_loss_steps", "50"])
    path = write_config_file(tmp_path / "run.yaml", config.to_flags(), "header")
    assert "validation_loss_steps: 50\n" in path.read_text(encoding="utf-8")
    assert parse_args(["--config", str(path)]) == config
    (tmp_path / "run.toml").write_text('validation_dataset_metadata_path = "val.csv"\nvalidation_loss_steps = 50\n'
                                       'validation_dataset_base_path = "val"\n', encoding="utf-8")
    assert parse_args([*FLAGS, "--config", str(tmp_path / "run.toml")]).validation_loss == config.validation_loss


def test_toml_works_like_yaml(tmp_path):
    (tmp_path / "run.toml").write_text('learning_rate = 1e-4\nlora_rank = 8\nlora_base_model = "dit"\n'
                                       "use_gradient_checkpointing = true\n", encoding="utf-8")
    assert read_config_file(tmp_path / "run.toml", build_parser()) == {
        "learning_rate": 1e-4, "lora_rank": 8, "lora_base_model": "dit", "use_gradient_checkpointing": True}


def test_yaml_values_convert_as_the_command_line_does(tmp_path):
    # YAML 1.1 reads 1e-4 as a string; the flag's type makes it the number. The alias names its flag too.
    (tmp_path / "run.yml").write_text("learning_rate: 1e-4\nlora_rank: 16\nmax_grad_norm: 2\n"
                                      "gradient_checkpointing: true\nvram_budget: 24\n", encoding="utf-8")
    values = read_config_file(tmp_path / "run.yml", build_parser())
    assert values == {"learning_rate": 1e-4, "lora_rank": 16, "max_grad_norm": 2.0,
                      "use_gradient_checkpointing": True, "vram_budget": "24"}
    assert type(values["learning_rate"]) is float


def test_the_command_line_overrides_the_file(tmp_path):
    (tmp_path / "run.yaml").write_text("lora_rank: 16\nlearning_rate: 1e-4\nnum_epochs: 3\n", encoding="utf-8")
    config = parse_args([*FLAGS, "--config", str(tmp_path / "run.yaml"), "--lora_rank", "4"])
    assert (config.lora.lora_rank, config.training.learning_rate, config.training.num_epochs) == (4, 1e-4, 3)
    assert parse_args([*FLAGS, f"--config={tmp_path / 'run.yaml'}"]).lora.lora_rank == 16


def test_unknown_keys_are_refused_with_the_nearest_flag(tmp_path):
    found = problems(tmp_path / "run.yaml", "learing_rate: 1e-4\nlora_rnak: 4\nno_such_thing_at_all: 1\n")
    assert found == [
        f"--config {tmp_path / 'run.yaml'}: unknown key 'learing_rate'; did you mean learning_rate? (keys are the "
        "trainer's flags without --)",
        f"--config {tmp_path / 'run.yaml'}: unknown key 'lora_rnak'; did you mean lora_rank? (keys are the trainer's "
        "flags without --)",
        f"--config {tmp_path / 'run.yaml'}: unknown key 'no_such_thing_at_all'; see --help for the flags (keys are the "
        "trainer's flags without --)",
    ]


def test_every_wrong_value_is_named_at_once(tmp_path):
    found = problems(tmp_path / "run.yaml", "lora_rank: four\nuse_gradient_checkpointing: 1\nmixed_precision: no\n"
                                            "task: sfx\nmodel_paths: [a, b]\nnum_epochs: null\nconfig: other.yaml\n"
                                            "lora_alpha: 8\nlora_alpha: 16\n")
    assert len(found) == 8
    assert "the key 'lora_alpha' is given 2 times (lines 8, 9); keep one" in found[0]
    assert "lora_rank: 'four' is not an integer, as --lora_rank needs; write e.g. lora_rank: 32" in found[1]
    assert "use_gradient_checkpointing: 1, but --use_gradient_checkpointing is a switch; write " \
           "use_gradient_checkpointing: true (or false)" in found[2]
    assert 'mixed_precision: False is a boolean' in found[3] and 'e.g. mixed_precision: "no"' in found[3]
    assert "task: 'sfx' is not a choice of --task; write one of sft, sft:data_process" in found[4]
    assert "model_paths: ['a', 'b'] is a list" in found[5]
    assert "num_epochs: null, but --num_epochs has no unset value (its default is 1)" in found[6]
    assert "the key 'config' names another config file" in found[7]
    assert all(problem.startswith(f"--config {tmp_path / 'run.yaml'}") for problem in found)


def test_a_flag_given_under_two_names_is_refused(tmp_path):
    found = problems(tmp_path / "run.yaml", "use_gradient_checkpointing: true\ngradient_checkpointing: true\n")
    assert found == [f"--config {tmp_path / 'run.yaml'}: the keys 'use_gradient_checkpointing' and "
                     "'gradient_checkpointing' both set --use_gradient_checkpointing; keep one"]


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("run.json", "{}", "the suffix '.json' is not a config file's; write the file as YAML (.yaml, .yml) or TOML"),
    ("run.yaml", None, "no such file (a relative path is read from"),
    ("run.yaml", "lora_rank: [4\n", "is not valid YAML ("),
    ("run.toml", "lora_rank = \n", "is not valid TOML ("),
    ("run.yaml", "- lora_rank\n", "holds a list, not a mapping of flag names to values"),
    ("run.yaml", "", "holds nothing, not a mapping of flag names to values"),
])  # fmt: skip
def test_files_that_are_not_config_files_are_refused(tmp_path, name, text, expected):
    found = problems(tmp_path / name, text)
    assert len(found) == 1 and found[0].startswith(f"--config {tmp_path / name}") and expected in found[0]


def test_a_bad_config_file_exits_with_its_problem_alone(tmp_path, capsys):
    (tmp_path / "run.yaml").write_text("learing_rate: 1e-4\n", encoding="utf-8")
    with pytest.raises(SystemExit) as caught:
        parse_args([*FLAGS, "--config", str(tmp_path / "run.yaml")])
    error = capsys.readouterr().err
    assert caught.value.code == 2 and "did you mean learning_rate?" in error and "usage:" not in error


def test_the_run_config_reruns_from_the_start_with_what_the_run_resolved(tmp_path):
    overwrite = parse_args([*FLAGS, "--output_path", str(tmp_path), "--overwrite_output", "--vram_budget", "24"])
    path = save_run_config(overwrite.with_seed(11), "run123")
    text = path.read_text(encoding="utf-8")
    assert path == tmp_path / RUN_CONFIG_FILE and "training run run123" in text and "--config" in text
    written = yaml.safe_load(text)
    assert written["seed"] == 11 and written["overwrite_output"] is False and written["vram_budget"] is None
    assert list(written)[:2] == ["dataset_base_path", "dataset_metadata_path"]  # --help order
    assert previous_outputs(tmp_path, TRAINING_OUTPUTS) == [path]  # the run's file, for --overwrite_output
    resumed = parse_args([*FLAGS, "--output_path", str(tmp_path), "--resume_from_checkpoint", "latest"])
    text = save_run_config(resumed.with_seed(11), "run123").read_text(encoding="utf-8")
    assert yaml.safe_load(text)["resume_from_checkpoint"] is None and "resumed (--resume_from_checkpoint latest)" in text


def first_command(path: Path) -> str:
    """The first training command of a script, or of a Markdown page's ``bash`` blocks."""
    text = path.read_text(encoding="utf-8")
    return re.search(r"```bash\n((?:accelerate launch|diffsynth-launch) .*?)```", text, re.DOTALL)[1] \
        if path.suffix == ".md" else text


@pytest.mark.parametrize(("config", "source", "video"), [
    ("qwen_image_lora.yaml", "README.md", False),
    ("wan_lora.yaml", "examples/wanvideo/model_training/lora/Wan2.1-T2V-1.3B.sh", True),
])  # fmt: skip
def test_the_example_configs_are_the_commands_they_mirror(config, source, video):
    _, argv = trainer_argv(launch_commands(first_command(REPO / source))[0])
    from_file = parse_args(["--config", str(REPO / "configs" / config)], video=video)
    assert isinstance(from_file, RunConfig) and from_file == parse_args(argv, video=video)


def test_config_yaml_of_a_run_trains_the_same_lora(base, dataset, fresh_accelerate_state, tmp_path):
    seed = COMMON.index("--seed")
    unseeded = COMMON[:seed] + COMMON[seed + 2:]
    first, second = tmp_path / "first", tmp_path / "second"
    main(QwenImagePipeline, [*raw(dataset), *unseeded, "--output_path", str(first)])  # 3 steps
    assert isinstance(yaml.safe_load((first / RUN_CONFIG_FILE).read_text(encoding="utf-8"))["seed"], int)
    reset_accelerate_state()
    main(QwenImagePipeline, ["--config", str(first / RUN_CONFIG_FILE), "--output_path", str(second)])
    trained, rerun = lora(first, "epoch-0"), lora(second, "epoch-0")
    assert trained.keys() == rerun.keys() and all(torch.equal(trained[key], rerun[key]) for key in trained)
