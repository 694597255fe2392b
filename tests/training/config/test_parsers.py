"""The trainer flags: reference defaults, every cross-flag check, comma lists, tasks and the Markdown flag table."""

import argparse
import logging

import pytest

from diffsynth.training.config import RunConfig, build_parser, parse_args
from diffsynth.training.config.errors import TASKS, FlagError, split_csv, task_stage
from diffsynth.training.config.flag_docs import flag_table
from diffsynth.training.config.parsers import closest_flags, parse_flags, uses_bitsandbytes
from diffsynth.training.config.reference_flags import SWITCHES, UNSUPPORTED
from diffsynth.training.loop import stage_one

# The reference trainer's flags and defaults; a reference command must mean the same here.
REFERENCE_DEFAULTS = {
    "dataset_base_path": "", "dataset_metadata_path": None, "dataset_repeat": 1, "dataset_num_workers": 0,
    "data_file_keys": "image,video",
    "height": None, "width": None, "max_pixels": 1048576,
    "model_paths": None, "model_id_with_origin_paths": None, "tokenizer_path": None, "extra_inputs": None,
    "quant_options": None,
    "processor_path": None, "zero_cond_t": False, "tokenizer_1_path": None, "tokenizer_2_path": None,
    "align_to_opensource_format": False,
    "offload_models": None, "initialize_model_on_cpu": False, "enable_npu_patch": False,
    "learning_rate": 1e-4, "num_epochs": 1, "trainable_models": None, "find_unused_parameters": False,
    "weight_decay": 0.01, "task": "sft", "gradient_accumulation_steps": 1, "customized_optimizer": None,
    "remove_prefix_in_ckpt": "pipe.dit.", "save_steps": None,
    "lora_base_model": None, "lora_rank": 32, "lora_checkpoint": None,
    "preset_lora_path": None, "preset_lora_model": None,
    "use_gradient_checkpointing": False, "use_gradient_checkpointing_offload": False,
    "enable_model_cpu_offload": False, "enable_optimizer_cpu_offload": False, "cpu_offload_split_threshold": None,
    "enable_tensorboard_log": False, "enable_csv_log": False, "enable_wandb_log": False, "wandb_project": "diffsynth",
}  # fmt: skip
# Flags beyond the reference: each defaults to changing nothing.
EXTRA_DEFAULTS = {
    "seed": None, "lr_scheduler": "constant", "lr_warmup_steps": 0, "max_grad_norm": None, "mixed_precision": "no",
    "resume_from_checkpoint": None, "max_train_steps": None, "lora_alpha": None, "torch_dtype": "bfloat16", "checkpoints_total_limit": 2,
    "min_timestep_boundary": 0.0, "max_timestep_boundary": 1.0, "fp8_models": None,
    "blocks_to_swap": 0, "block_swap_h2d_only": False, "block_swap_ring_size": 2,
    "use_pinned_memory_for_block_swap": False, "offload_prefetch_depth": None, "overwrite_output": False,
    "on_bad_sample": "stop", "allow_partial_cache": False, "vram_budget": None, "ram_budget": None,
    "timestep_sampling": "grid", "weighting_scheme": None, "sigmoid_scale": None, "logit_mean": None,
    "logit_std": None, "discrete_flow_shift": None, "mode_scale": None, "batch_size": 1, "aspect_ratio_buckets": False,
    "validation_prompts": None, "validation_steps": None, "validation_epochs": None,
    "validation_num_inference_steps": 20, "validation_cfg_scale": None, "validation_seed": 0,
    "validation_dataset_metadata_path": None, "validation_dataset_base_path": None, "validation_loss_steps": None,
    "shared_host_weights": "auto", "ema_decay": None, "fused_optimizer_step": False,
    "full_checkpoint_format": "auto",
    "reg_dataset_metadata_path": None, "reg_dataset_base_path": None, "prior_loss_weight": 1.0,
    "lora_type": "lora", "use_dora": False, "lokr_factor": -1,
    "masked_loss": False, "unmasked_weight": None,
}  # fmt: skip
# Deliberate departures: the reference's --output_path ./models is also the model folder (DIFFSYNTH_MODEL_BASE_PATH);
# its --lora_target_modules default q,k,v,o,ffn.0,ffn.2 names Wan's layers whatever the model, so unset here stands for
# the model's own (BasePipeline.default_lora_target_modules, the layers its LoRA scripts name; Wan's are those).
DEPARTURES = {"output_path": "./output", "lora_target_modules": None}
# Safety nets on by default: they change no healthy run's weights, only what a failing or interrupted run leaves.
SAFETY_DEFAULTS = {"checkpoint_every_minutes": 30.0, "max_nonfinite_steps": 3}
# What the run prints: nothing that changes the training.
CONSOLE_DEFAULTS = {"progress_interval_seconds": 30.0, "debug": False}
# A config file of flags is read only when named.
CONFIG_DEFAULTS = {"config": None}
# The reference's flags this trainer refuses when given (reference_flags.UNSUPPORTED): unset unless given.
REFUSED_DEFAULTS = {flag[2:]: False if flag in SWITCHES else None for flag in UNSUPPORTED}
VALID = ["--model_id_with_origin_paths", "Qwen/Qwen-Image:transformer/*.safetensors", "--lora_base_model", "dit",
         "--dataset_metadata_path", "data/metadata.csv"]
STAGE_TWO = [flag for flag in VALID if flag not in ("--dataset_metadata_path", "data/metadata.csv")]


def test_defaults_match_the_reference_and_extras_change_nothing():
    args = build_parser().parse_args([])
    assert vars(args) == {**REFERENCE_DEFAULTS, **EXTRA_DEFAULTS, **DEPARTURES, **SAFETY_DEFAULTS, **CONSOLE_DEFAULTS,
                          **CONFIG_DEFAULTS, **REFUSED_DEFAULTS}
    video = build_parser(video=True).parse_args([])
    # The reference's Wan trainer forces gradient checkpointing on (examples/wanvideo/model_training/train.py).
    assert vars(video) == {**REFERENCE_DEFAULTS, **EXTRA_DEFAULTS, **DEPARTURES, **SAFETY_DEFAULTS, **CONSOLE_DEFAULTS,
                           **CONFIG_DEFAULTS, **REFUSED_DEFAULTS,
                           "num_frames": 81, "allow_shorter_videos": False, "frame_rate": None,
                           "use_gradient_checkpointing": True}
    assert "Always on for video (Wan) training" in " ".join(build_parser(video=True).format_help().split())


def test_a_valid_command_parses_with_its_types():
    args = parse_args(VALID + ["--learning_rate", "2e-5", "--height", "512", "--width", "768", "--lora_alpha", "16",
                               "--cpu_offload_split_threshold", "64.5", "--enable_model_cpu_offload"])
    assert (args.training.learning_rate, args.dataset.height, args.dataset.width, args.lora.lora_alpha) == (
        2e-5, 512, 768, 16.0)
    assert args.placement.cpu_offload_split_threshold == 64.5


def test_every_task_is_accepted_and_an_unknown_one_lists_the_choices(capsys):
    for task in TASKS:
        command = STAGE_TWO + ["--dataset_base_path", "cache"] if task.endswith(":train") else VALID
        assert parse_args(command + ["--task", task]).training.task == task
    with pytest.raises(SystemExit) as exit_info:
        parse_args(VALID + ["--task", "sft:everything"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "--task" in error and "sft:everything" in error and all(task in error for task in TASKS)


def test_task_stage_and_split_csv():
    assert task_stage("sft") == ("sft", None)
    assert task_stage("sft:data_process") == ("sft", "data_process")
    assert task_stage("direct_distill:train") == ("direct_distill", "train")
    with pytest.raises(ValueError, match=r"--task 'dpo'.*sft, sft:data_process"):
        task_stage("dpo")
    assert split_csv("to_q, to_k,,to_out.0 ,") == ["to_q", "to_k", "to_out.0"]
    assert split_csv(None) == split_csv("") == split_csv(" , ") == []


# (extra flags, fragments the message must hold: the flag, the value, and the fix).
CONFLICTS = [
    (["--enable_optimizer_cpu_offload"], ["--enable_optimizer_cpu_offload", "add --enable_model_cpu_offload"]),
    (["--cpu_offload_split_threshold", "128"], ["--cpu_offload_split_threshold 128", "add --enable_model_cpu_offload"]),
    (["--enable_model_cpu_offload", "--cpu_offload_split_threshold", "0"],
     ["--cpu_offload_split_threshold 0", "positive size in MB", "--cpu_offload_split_threshold 256"]),
    (["--lora_rank", "0"], ["--lora_rank 0", "at least 1", "--lora_rank 32"]),
    (["--blocks_to_swap", "2", "--enable_model_cpu_offload"], ["--blocks_to_swap 2", "use one of them"]),
    (["--offload_prefetch_depth", "1"], ["--offload_prefetch_depth 1", "add --enable_model_cpu_offload"]),
    (["--blocks_to_swap", "2", "--block_swap_h2d_only"], ["--block_swap_h2d_only", "add --use_gradient_checkpointing"]),
    (["--block_swap_h2d_only", "--use_gradient_checkpointing"], ["add --blocks_to_swap N"]),
    (["--min_timestep_boundary", "0.6", "--max_timestep_boundary", "0.5"],
     ["--min_timestep_boundary 0.6", "--max_timestep_boundary 0.5", "0 <= min < max <= 1"]),
    (["--lora_alpha", "-1"], ["--lora_alpha -1", "greater than 0", "drop it"]),
    (["--learning_rate", "0"], ["--learning_rate 0", "greater than 0", "--learning_rate 1e-4"]),
    (["--num_epochs", "0"], ["--num_epochs 0", "at least 1", "--num_epochs 1"]),
    (["--dataset_repeat", "0"], ["--dataset_repeat 0", "at least 1"]),
    (["--dataset_num_workers", "-2"], ["--dataset_num_workers -2", "at least 0"]),
    (["--gradient_accumulation_steps", "0"], ["--gradient_accumulation_steps 0", "at least 1"]),
    (["--save_steps", "0"], ["--save_steps 0", "at least 1", "drop it to save once per epoch"]),
    (["--lr_warmup_steps", "-1"], ["--lr_warmup_steps -1", "at least 0"]),
    (["--lr_warmup_steps", "100"], ["--lr_warmup_steps 100", "--lr_scheduler constant", "constant_with_warmup"]),
    (["--max_train_steps", "0"], ["--max_train_steps 0", "at least 1"]),
    (["--max_grad_norm", "0"], ["--max_grad_norm 0", "greater than 0", "--max_grad_norm 1.0"]),
    (["--height", "512"], ["--height 512", "without --width", "pass both"]),
    (["--width", "512"], ["--width 512", "without --height"]),
    (["--height", "500", "--width", "512"], ["--height 500", "multiple of 16", "--height 496"]),
    (["--height", "512", "--width", "0"], ["--width 0", "positive multiple of 16", "--width 16"]),
    (["--max_pixels", "255"], ["--max_pixels 255", "at least 256", "--max_pixels 1048576"]),
    (["--task", "sft:train"], ["--task sft:train", "--dataset_base_path is empty", "sft:data_process"]),
    (["--task", "direct_distill:train"], ["--dataset_base_path", "direct_distill:data_process run"]),
    (["--batch_size", "0"], ["--batch_size 0", "at least 1"]),
    (["--timestep_sampling", "shift", "--weighting_scheme", "mode"], ["--weighting_scheme mode", "grid only"]),
    (["--timestep_sampling", "uniform", "--discrete_flow_shift", "3"], ["--discrete_flow_shift 3.0 has no effect"]),
    (["--timestep_sampling", "sigmoid", "--task", "direct_distill"], ["--task direct_distill", "draws no timesteps"]),
]


@pytest.mark.parametrize("extra,fragments", CONFLICTS, ids=[" ".join(case[0]) for case in CONFLICTS])
def test_each_conflict_names_flag_value_and_fix(extra, fragments, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(VALID + extra)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    for fragment in fragments:
        assert fragment in error


def test_nothing_to_train_and_no_model():
    args = build_parser().parse_args(["--lora_target_modules", "to_q,to_k", "--dataset_metadata_path", "m.csv"])
    with pytest.raises(FlagError) as error:
        RunConfig.from_namespace(args)
    no_model, nothing = error.value.problems
    assert "--task sft has nothing to train" in nothing and "'to_q,to_k'" in nothing
    assert "add --lora_base_model dit" in nothing and "--trainable_models dit" in nothing
    assert no_model.startswith("no model given") and "--model_id_with_origin_paths" in no_model
    # A full fine-tune trains without a LoRA; stage 1 of a split run trains nothing at all.
    model = ["--model_paths", '["dit.safetensors"]', "--dataset_metadata_path", "m.csv"]
    assert parse_args(model + ["--trainable_models", "dit"]).lora.lora_base_model is None
    assert parse_args(model + ["--task", "sft:data_process"]).training.task == "sft:data_process"


def test_unset_lora_target_modules_become_the_models_defaults_and_given_ones_stay():
    from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
    from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline

    unset = parse_args(VALID)
    assert unset.lora.lora_target_modules is None
    with pytest.raises(ValueError, match="--lora_target_modules is unset .* RunConfig.with_pipeline_defaults"):
        unset.lora.targets  # noqa: B018 - reading it is the test
    qwen = unset.with_pipeline_defaults(QwenImagePipeline)
    assert qwen.lora.targets == split_csv(QwenImagePipeline.default_lora_target_modules)
    assert qwen.to_flags()["lora_target_modules"] == QwenImagePipeline.default_lora_target_modules
    assert unset.with_pipeline_defaults(WanVideoPipeline).lora.targets == ["q", "k", "v", "o", "ffn.0", "ffn.2"]
    given = parse_args([*VALID, "--lora_target_modules", "to_q,to_k"])
    assert given.with_pipeline_defaults(QwenImagePipeline) is given and given.lora.targets == ["to_q", "to_k"]


def test_dataset_flags_must_fit_the_stage():
    with pytest.raises(FlagError, match="--dataset_metadata_path is unset"):
        RunConfig.from_namespace(build_parser().parse_args(STAGE_TWO))
    with pytest.raises(FlagError, match=r"drop --dataset_metadata_path 'data/metadata.csv'"):
        RunConfig.from_namespace(build_parser().parse_args(VALID + ["--task", "sft:train", "--dataset_base_path", "cache"]))


def test_all_conflicts_are_reported_at_once():
    args = build_parser().parse_args(VALID + ["--num_epochs", "0", "--lora_rank", "0", "--width", "8"])
    with pytest.raises(FlagError) as error:
        RunConfig.from_namespace(args)
    assert len(error.value.problems) == 4  # epochs, rank, width alone, width not a multiple of 16
    assert isinstance(error.value, ValueError) and str(error.value).count("\n") == 3


def test_output_path_that_is_a_file(tmp_path, capsys):
    existing = tmp_path / "weights.safetensors"
    existing.write_bytes(b"")
    with pytest.raises(SystemExit):
        parse_args(VALID + ["--output_path", str(existing)])
    assert f"--output_path {str(existing)!r} is a file" in capsys.readouterr().err
    assert parse_args(VALID + ["--output_path", str(tmp_path / "new")]).output.output_path == str(tmp_path / "new")


def test_overwrite_output_cannot_remove_the_checkpoint_a_resume_reads(tmp_path):
    output = ["--output_path", str(tmp_path / "out"), "--overwrite_output"]
    for checkpoint in ("latest", str(tmp_path / "out" / "checkpoints" / "step-4")):
        with pytest.raises(FlagError, match=f"--resume_from_checkpoint {checkpoint} would resume from; drop"):
            RunConfig.from_namespace(build_parser().parse_args(VALID + output + ["--resume_from_checkpoint", checkpoint]))
    # A checkpoint from another folder may start a cleaned one.
    elsewhere = str(tmp_path / "other" / "checkpoints" / "step-4")
    assert RunConfig.from_namespace(build_parser().parse_args(VALID + output + ["--resume_from_checkpoint", elsewhere]))


def test_num_frames_must_be_4k_plus_1(capsys):
    assert parse_args(VALID + ["--num_frames", "49"], video=True).dataset.num_frames == 49
    with pytest.raises(SystemExit):
        parse_args(VALID + ["--num_frames", "80"], video=True)
    error = capsys.readouterr().err
    assert "--num_frames 80 must be 4k+1" in error and "--num_frames 81" in error


def test_frame_rate_must_be_a_positive_number(capsys):
    assert parse_args(VALID + ["--frame_rate", "29.97"], video=True).dataset.column_defaults == {"frame_rate": 29.97}
    assert parse_args(VALID, video=True).dataset.column_defaults == {}
    for value in ("0", "-24"):
        with pytest.raises(SystemExit):
            parse_args(VALID + [f"--frame_rate={value}"], video=True)
        assert (f"--frame_rate {float(value)} must be greater than 0.0; pass e.g. --frame_rate 24 (the clips' frames "
                "per second)") in " ".join(capsys.readouterr().err.split())
    with pytest.raises(SystemExit):  # the image trainer has no video flags
        parse_args(VALID + ["--frame_rate", "24"])
    assert "unknown flag" in capsys.readouterr().err


def test_checkpointing_offload_implies_checkpointing():
    placement = parse_args(VALID + ["--use_gradient_checkpointing_offload"]).placement
    assert placement.gradient_checkpointing and placement.use_gradient_checkpointing_offload
    assert not parse_args(VALID).placement.gradient_checkpointing


def test_optimizer_offload_in_stage_one_parses_and_only_warns(caplog):
    argv = VALID + ["--task", "sft:data_process", "--enable_model_cpu_offload", "--enable_optimizer_cpu_offload"]
    config = parse_args(argv)
    with caplog.at_level(logging.WARNING, logger=stage_one.__name__):
        with pytest.raises(AttributeError):  # warned before anything else is read of the (missing) accelerator
            stage_one.launch_data_process_task(None, None, _NoCacheModule(), config)
    assert "--enable_optimizer_cpu_offload is ignored by --task sft:data_process" in caplog.text


def test_a_namespace_built_in_code_with_an_unknown_task_is_a_flag_error():
    args = build_parser().parse_args(VALID)
    args.task = "pretrain"
    with pytest.raises(FlagError, match="--task 'pretrain' is not a known task; choose one of sft"):
        RunConfig.from_namespace(args)


def test_flag_table_lists_every_flag_under_its_group():
    parser = build_parser(video=True)
    table = flag_table(parser)
    flags = [option for action in parser._actions for option in action.option_strings[:1]
             if not isinstance(action, argparse._HelpAction)]
    assert len(flags) == (len(REFERENCE_DEFAULTS) + len(EXTRA_DEFAULTS) + len(DEPARTURES) + len(SAFETY_DEFAULTS)
                          + len(CONSOLE_DEFAULTS) + len(CONFIG_DEFAULTS) + len(REFUSED_DEFAULTS)
                          + 3)  # + the video flags --num_frames, --allow_shorter_videos, --frame_rate
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == flags
    assert "--help" not in table
    for title in ("Dataset", "Video size", "Model", "Training", "Masked loss", "Output", "LoRA", "Gradient checkpointing",
                  "Offload training", "Block swap", "Memory planner", "Logging", "Console",
                  "Reference flags not supported here"):
        assert f"### {title}\n\n| Flag | Default | Description |\n| --- | --- | --- |" in table
    assert "| `--dataset_base_path` | `\"\"` |" in table and "| `--lora_rank` | `32` |" in table
    assert "| `--seed` | unset |" in table and "| `--enable_csv_log` | `False` |" in table
    assert "Choices: constant, linear, cosine, constant_with_warmup." in table
    assert "### Image size" in flag_table(build_parser()) and "--num_frames" not in flag_table(build_parser())


def test_flag_table_escapes_pipes_and_handles_extra_flags():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="a|b", help="one | two\n   lines")
    parser.add_argument("target", help="positional")
    table = flag_table(parser)
    assert '| `--mode` | `"a\\|b"` | one \\| two lines |' in table
    assert "| `target` | unset | positional |" in table


FLOAT_FLAGS = [action.option_strings[0] for action in build_parser(video=True)._actions if action.type is float]


def test_the_float_flags_are_the_ones_expected():
    assert set(FLOAT_FLAGS) == {"--learning_rate", "--weight_decay", "--max_grad_norm", "--min_timestep_boundary",
                                "--max_timestep_boundary", "--checkpoint_every_minutes", "--lora_alpha",
                                "--cpu_offload_split_threshold", "--progress_interval_seconds", "--sigmoid_scale",
                                "--logit_mean", "--logit_std", "--discrete_flow_shift", "--mode_scale",
                                "--validation_cfg_scale", "--ema_decay", "--prior_loss_weight", "--unmasked_weight",
                                "--frame_rate"}


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
@pytest.mark.parametrize("flag", FLOAT_FLAGS)
def test_every_float_flag_refuses_nan_and_inf(flag, value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        # "-inf" alone reads as a flag; the video trainer's parser has every float flag.
        parse_args(VALID + ["--enable_model_cpu_offload", f"{flag}={value}"], video=True)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert f"{flag} {float(value)} must be a finite number (nan and inf are refused); pass e.g. {flag} " in error
    problems = error.split("error:")[1].strip().splitlines()
    assert len([line for line in problems if flag in line]) == 1  # not also a bound or range complaint


def test_a_preset_lora_needs_its_model_and_its_file_together(capsys):
    for given in (["--preset_lora_path", "preset.safetensors"], ["--preset_lora_model", "dit"]):
        with pytest.raises(SystemExit):
            parse_args(VALID + given)
        error = " ".join(capsys.readouterr().err.split())
        assert f"{given[0]} {given[1]} needs --preset_lora_" in error and "pass both" in error
    lora = parse_args(VALID + ["--preset_lora_path", "preset.safetensors", "--preset_lora_model", "dit"]).lora
    assert (lora.preset_lora_path, lora.preset_lora_model) == ("preset.safetensors", "dit")


@pytest.mark.parametrize(("path", "fragment"), [
    ("Adam", "is not a dotted class path"),
    ("no_such_package.optim.Adam", "module no_such_package.optim does not import"),
    ("torch.optim.Adamm", "module torch.optim has no Adamm"),
    ("torch.nn.Linear", "which is not a torch.optim.Optimizer subclass"),
])
def test_a_customized_optimizer_that_does_not_resolve_is_refused(path, fragment, capsys):
    with pytest.raises(SystemExit):
        parse_args(VALID + ["--customized_optimizer", path])
    error = " ".join(capsys.readouterr().err.split())
    assert f"--customized_optimizer {path}" in error and fragment in error


def test_a_customized_optimizer_is_checked_and_kept():
    optimizer = parse_args(VALID + ["--customized_optimizer", "torch.optim.Adam"]).training.customized_optimizer
    assert optimizer == "torch.optim.Adam"
    with pytest.raises(FlagError, match="has no effect on --task sft:data_process"):
        RunConfig.from_namespace(build_parser().parse_args(VALID + ["--customized_optimizer", "torch.optim.Adam", "--task",
                                                         "sft:data_process"]))


def test_musubi_tuners_spelling_of_gradient_checkpointing_sets_the_same_flag():
    assert parse_args(VALID + ["--gradient_checkpointing"]).placement.use_gradient_checkpointing is True
    assert parse_args(VALID).placement.use_gradient_checkpointing is False


def test_resume_from_checkpoint_tells_a_weights_file_from_a_state_folder(tmp_path, capsys):
    (tmp_path / "step-4").mkdir()
    state = parse_args(VALID + ["--resume_from_checkpoint", str(tmp_path / "step-4")]).training
    assert (state.resume_checkpoint, state.initial_weights) == (str(tmp_path / "step-4"), None)
    latest = parse_args(VALID + ["--resume_from_checkpoint", "latest"]).training
    assert (latest.resume_checkpoint, latest.initial_weights) == ("latest", None)
    weights = parse_args(VALID + ["--resume_from_checkpoint", "models/epoch-4.safetensors"]).training
    assert (weights.resume_checkpoint, weights.initial_weights) == (None, "models/epoch-4.safetensors")
    (tmp_path / "epoch-4.bin").write_bytes(b"pickle")
    with pytest.raises(SystemExit):
        parse_args(VALID + ["--resume_from_checkpoint", str(tmp_path / "epoch-4.bin")])
    assert "is a file but not .safetensors" in " ".join(capsys.readouterr().err.split())


class _NoCacheModule:
    """What stage 1 reads of a training module before it places the models: nothing to cache, no weights."""

    def cache_info(self) -> dict:
        return {}

    def stage_one_identity(self) -> dict:
        return {}


def errors_of(argv, capsys, parse=parse_args):
    """The stderr lines of ``parse(argv)``, which must exit with 2, with the command's name taken off each."""
    with pytest.raises(SystemExit) as exit_info:
        parse(argv)
    assert exit_info.value.code == 2
    prog = build_parser().prog
    lines = capsys.readouterr().err.splitlines()
    assert all(line.startswith(f"{prog}: ") for line in lines), lines
    return [line[len(prog) + 2:] for line in lines]


HINT = "run with --help for all flags"


@pytest.mark.parametrize("extra, message", [
    (["--lora_rank", "0"], "--lora_rank 0 must be at least 1; pass e.g. --lora_rank 32"),
    (["--num_epochs", "-1"], "--num_epochs -1 must be at least 1; pass e.g. --num_epochs 1"),
    (["--lora_rnak", "4"], "--lora_rnak 4: unknown flag; did you mean --lora_rank?"),
])  # fmt: skip
def test_a_bad_flag_is_one_line_and_the_help_hint_not_the_usage(extra, message, capsys):
    # The usage of every flag was some 95 lines above the one that matters.
    assert errors_of(VALID + extra, capsys) == [f"error: {message}", HINT]


def test_each_problem_is_a_line_of_its_own(capsys):
    assert errors_of(VALID + ["--num_epochs", "0", "--lora_rank", "0"], capsys) == [
        "error: --num_epochs 0 must be at least 1; pass e.g. --num_epochs 1",
        "error: --lora_rank 0 must be at least 1; pass e.g. --lora_rank 32", HINT]


def test_unknown_flags_name_their_values_and_the_closest_flags(capsys):
    extra = ["--lerning_rate", "-1e-4", "--validaton_prompts=a cat", "--lora-rank", "8", "--zzz_qqq"]
    assert errors_of(VALID + extra, capsys) == [
        "error: --lerning_rate -1e-4: unknown flag; did you mean --learning_rate?",  # a negative number is a value
        "error: '--validaton_prompts=a cat': unknown flag; did you mean --validation_prompts?",
        "error: --lora-rank 8: unknown flag; did you mean --lora_rank?",
        "error: --zzz_qqq: unknown flag; no flag is close to it", HINT]


def test_a_value_no_flag_takes_is_named(capsys):
    # A space-separated list: --lora_target_modules takes one value, "to_k" is left over.
    assert errors_of(VALID + ["--lora_target_modules", "to_q", "to_k"], capsys) == [
        ("error: to_k: a value that follows no flag taking it; drop it, or quote it together with the value before "
         "it if both are one value"), HINT]


def test_argparse_errors_are_short_too(capsys):
    assert errors_of(VALID + ["--lora_rank", "x"], capsys) == ["error: argument --lora_rank: invalid int value: 'x'",
                                                               HINT]


def test_closest_flags_are_about_as_close_as_the_best():
    flags = [option for action in build_parser()._actions for option in action.option_strings]
    assert closest_flags("--lora_rnak", flags) == ["--lora_rank"]  # not --lora_alpha as well
    assert closest_flags("--rank", flags) == ["--lora_rank", "--task"]
    assert closest_flags("--nothing_like_it", flags) == []


def test_the_planner_shares_the_short_errors(capsys):
    from diffsynth.plan import main as plan_main

    assert errors_of(["--lora_rnak", "4", "--device_profile", "rtx4090-24gb"], capsys, parse=plan_main) == [
        "error: --lora_rnak 4: unknown flag; did you mean --lora_rank?", HINT]


@pytest.mark.parametrize(("flags", "uses"), [
    ([], False),
    (["--customized_optimizer", "torch.optim.Adam"], False),
    (["--customized_optimizer", "bitsandbytes.optim.AdamW8bit"], True),
    (["--customized_optimizer", "my_package.MyOptimizer"], True),  # might import it
    (["--quant_options", "Qwen/Qwen-Image:transformer/*.safetensors:bitsandbytes_nf4"], True),
    (["--model_id_with_origin_paths", "ideogram-ai/ideogram-4-nf4:transformer/*.safetensors"], True),  # packed
    (["--model_id_with_origin_paths", "ideogram-ai/ideogram-4-fp8:transformer/*.safetensors"], False),
])
def test_the_flags_say_whether_the_run_may_need_bitsandbytes(flags, uses):
    assert uses_bitsandbytes(parse_flags(flags)) is uses
