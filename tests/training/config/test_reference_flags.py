"""Every flag of the reference trainer parses here: it works, or it is refused by name, never "unrecognized"."""

import pytest

from diffsynth.training.config import RunConfig, build_parser, parse_args
from diffsynth.training.config.errors import FlagError
from diffsynth.training.config.flag_docs import reference_flag_table
from diffsynth.training.config.reference_flags import REFERENCE_FLAGS, UNSUPPORTED

VALID = ["--model_id_with_origin_paths", "Qwen/Qwen-Image:transformer/*.safetensors", "--lora_base_model", "dit",
         "--dataset_metadata_path", "data/metadata.csv"]


def test_every_reference_flag_is_known_to_one_of_the_trainers():
    table = reference_flag_table([build_parser(), build_parser(video=True)])
    assert "| missing |" not in table and table.count("\n") == len(REFERENCE_FLAGS) + 2
    wan_only = {flag for flag, where in REFERENCE_FLAGS.items() if where == "wanvideo train.py"}
    image = {option for action in build_parser()._actions for option in action.option_strings}
    assert set(REFERENCE_FLAGS) - image <= {"--num_frames", "--frame_rate"} and wan_only - {"--num_frames"} <= image


@pytest.mark.parametrize("flag", sorted(UNSUPPORTED))
def test_an_unsupported_reference_flag_parses_and_is_refused_by_name(flag):
    parser = build_parser(video=True)
    action = next(action for action in parser._actions if flag in action.option_strings)
    argv = VALID + ([flag] if action.nargs == 0 else [flag, "1"])
    with pytest.raises(FlagError) as error:
        RunConfig.from_namespace(parser.parse_args(argv))
    assert str(error.value).startswith(flag) and UNSUPPORTED[flag] in str(error.value)


def test_the_swanlab_flags_of_a_reference_command_are_refused_with_the_alternatives(capsys):
    with pytest.raises(SystemExit):
        parse_args(VALID + ["--enable_swanlab_log", "--swanlab_project", "mine"])
    error = " ".join(capsys.readouterr().err.split())
    assert "--enable_swanlab_log: SwanLab logging is not supported here; use --enable_wandb_log" in error
    assert "--swanlab_project mine: SwanLab logging is not supported here" in error
    assert "unrecognized arguments" not in error
