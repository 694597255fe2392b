"""Every ``accelerate launch ... train.py`` command in the example shell scripts parses and validates.

The scripts are read, not run: line continuations are joined, each command is split as the shell would split it,
and the words after ``train.py`` go through the trainer's own parser and cross-flag checks. A renamed flag or a
conflicting combination therefore fails here instead of in a user's terminal. A script carried for a release the
trainer refuses must stop on that refusal and nothing else.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from diffsynth.core.loader import parse_model_id_with_origin_paths
from diffsynth.pipelines.registry import refused_model_ids
from diffsynth.training.config import RunConfig, build_parser
from diffsynth.training.config.errors import FlagError

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((REPO / "examples").rglob("*.sh"))


def launch_commands(text: str) -> list[list[str]]:
    """The words of each ``accelerate launch`` or ``diffsynth-launch`` (the README's) command in a shell script,
    continuations joined, comments dropped."""
    joined = re.sub(r"\\\r?\n", " ", text)
    commands = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words[:2] == ["accelerate", "launch"] or words[:1] == ["diffsynth-launch"]:
            commands.append(words)
    return commands


def trainer_argv(words: list[str]) -> tuple[Path, list[str]]:
    """The training script a command launches and the arguments passed to it."""
    index = next((i for i, word in enumerate(words) if word.endswith("train.py")), None)
    assert index is not None, f"no train.py in command {shlex.join(words)}"
    return REPO / words[index], words[index + 1:]


def _cases() -> list:
    cases = []
    for script in SCRIPTS:
        for number, words in enumerate(launch_commands(script.read_text()), start=1):
            cases.append(pytest.param(script, words, id=f"{script.relative_to(REPO / 'examples')}#{number}"))
    return cases


def parser_for(train_py: Path) -> argparse.ArgumentParser:
    """The parser of the trainer ``train_py`` runs: the video one (with ``--num_frames``) for a ``video=True`` entry."""
    return build_parser(video="video=True" in train_py.read_text())


@pytest.mark.parametrize(("training", "name"), [("qwen_image/model_training", "Qwen-Image"),
                                                ("wanvideo/model_training", "Wan2.1-T2V-1.3B")])
def test_expected_scripts_exist(training, name):
    names = {str(script.relative_to(REPO / "examples")) for script in SCRIPTS}
    assert {f"{training}/lora/{name}.sh", f"{training}/special/offload_training/{name}-LoRA.sh",
            f"{training}/special/split_training/{name}-LoRA.sh"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: str(path.relative_to(REPO / "examples")))
def test_script_stops_on_error_and_launches_training(script):
    text = script.read_text()
    assert re.search(r"^set -e", text, re.MULTILINE), f"{script} lacks `set -e`"
    assert launch_commands(text), f"{script} holds no `accelerate launch ... train.py` command"


def test_the_reference_wan_scripts_exist():
    """The reference's Wan commands (DiffSynth-Studio examples/wanvideo/model_training) under the same names."""
    names = {str(script.relative_to(REPO / "examples/wanvideo/model_training")) for script in SCRIPTS
             if script.is_relative_to(REPO / "examples/wanvideo")}
    assert {f"lora/{name}.sh" for name in ("Wan2.1-T2V-1.3B", "Wan2.1-I2V-14B-480P", "Wan2.2-T2V-A14B",
                                           "Wan2.2-I2V-A14B", "Wan2.2-TI2V-5B")} <= names
    assert {f"special/{kind}/Wan2.1-I2V-14B-480P.sh" for kind in ("split_training", "low_vram_training")} <= names


@pytest.mark.parametrize("script", ["qwen_image/model_training/special/split_training/Qwen-Image-LoRA.sh",
                                    "wanvideo/model_training/special/split_training/Wan2.1-T2V-1.3B-LoRA.sh",
                                    "wanvideo/model_training/special/split_training/Wan2.1-I2V-14B-480P.sh",
                                    "wanvideo/model_training/special/low_vram_training/Wan2.1-I2V-14B-480P.sh"])
def test_split_script_has_both_stages(script):
    tasks = []
    for words in launch_commands((REPO / "examples" / script).read_text()):
        train_py, argv = trainer_argv(words)
        tasks.append(parser_for(train_py).parse_args(argv).task)
    assert tasks == ["sft:data_process", "sft:train"]


def test_wan_commands_that_read_videos_name_the_frame_count():
    commands = [words for script in SCRIPTS if script.is_relative_to(REPO / "examples/wanvideo")
                for words in launch_commands(script.read_text())]
    assert commands, "no Wan training command found"
    for words in commands:
        train_py, argv = trainer_argv(words)
        args = parser_for(train_py).parse_args(argv)
        assert hasattr(args, "num_frames"), f"{train_py} does not build the video parser"
        # The default (81 frames) is rarely what a script means. Stage 2 reads latents stage 1 already sized.
        if not args.task.endswith(":train"):
            assert "--num_frames" in argv, f"no --num_frames in {shlex.join(words)}"


@pytest.mark.parametrize(("script", "words"), _cases())
def test_command_parses_and_validates(script, words, capsys):
    train_py, argv = trainer_argv(words)
    assert train_py.is_file(), f"{script} launches {train_py}, which does not exist"
    parser = parser_for(train_py)
    try:
        args = parser.parse_args(argv)
    except SystemExit:
        pytest.fail(f"{script}: the trainer rejects the command:\n{capsys.readouterr().err}")
    refused = [prefix for prefix in refused_model_ids() if prefix in (args.model_id_with_origin_paths or "")]
    try:
        RunConfig.from_namespace(args)
    except FlagError as error:
        if refused and all(any(prefix in problem for prefix in refused) for problem in error.problems):
            return
        pytest.fail(f"{script}: conflicting flags:\n" + "\n".join(error.problems))
    assert not refused, f"{script} loads {refused}, which the trainer refuses, yet its flags were accepted"
    # The trainer makes this check only after the dataset is read; a script can be checked now.
    if args.offload_models:
        models = parse_model_id_with_origin_paths(args.model_id_with_origin_paths)
        stray = [config.describe() for config in parse_model_id_with_origin_paths(args.offload_models)
                 if config not in models]
        assert not stray, f"{script}: --offload_models entries {stray} are not in --model_id_with_origin_paths"


def test_every_accelerate_config_a_script_names_exists_with_its_deepspeed_json():
    import yaml

    named = {words[words.index("--config_file") + 1] for script in SCRIPTS
             for words in launch_commands(script.read_text()) if "--config_file" in words}
    assert "examples/qwen_image/model_training/special/low_vram_training/deepspeed_zero3_cpuoffload.yaml" in named
    for relative in named:
        config = yaml.safe_load((REPO / relative).read_text())
        deepspeed_json = config.get("deepspeed_config", {}).get("deepspeed_config_file")
        assert deepspeed_json is None or (REPO / deepspeed_json).is_file(), f"{relative} names {deepspeed_json}"
