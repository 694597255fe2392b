"""The non-finite guard on real runs of the tiny Qwen-Image: a diverging run stops with exit code 3 and leaves only
finite files; a damaged sample is skipped (in every weight placement) and training goes on."""

import csv
import math

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from diffsynth.core.finite import nonfinite_names
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.training import cli, main
from diffsynth.training.loop.nonfinite_guard import NonFiniteGuard, TrainingDivergedError, step_is_finite
from diffsynth.training.outputs.checkpoint import load_training_state, resolve_checkpoint
from tests.conftest import reset_accelerate_state
from tests.training.test_trainer import COMMON, OFFLOAD_MODES, lora, max_difference, raw, stage_two_argv

POISONED = 1  # the sample whose cached latents are damaged


@pytest.fixture(autouse=True)
def in_process_runs(base, fresh_accelerate_state):
    """Every test here runs the trainer in-process on the tiny repos."""


def poison(path):
    """Writes NaN into a cached sample's latents, as damaged bytes on disk would."""
    with safe_open(str(path), framework="pt") as handle:
        metadata, tensors = handle.metadata(), {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
    tensors["shared/input_latents"][0, 0, 0, 0] = float("nan")
    save_file(tensors, str(path), metadata)


@pytest.fixture(scope="module")
def poisoned_cache(dataset, tmp_path_factory, tiny_root):
    folder = tmp_path_factory.mktemp("poisoned") / "cache"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(folder), "--task", "sft:data_process"])
    reset_accelerate_state()
    poison(folder / "0" / f"{POISONED}.safetensors")
    return folder


def two_epochs(cache, output, *extra):
    # Each epoch draws the poisoned sample once: two bad steps, never three in a row.
    return main(QwenImagePipeline, stage_two_argv(cache, output, "--num_epochs", "2", *extra))


@pytest.fixture(scope="module")
def poisoned_plain(poisoned_cache, tmp_path_factory, tiny_root):
    output = tmp_path_factory.mktemp("poisoned_plain") / "out"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        result = two_epochs(poisoned_cache, output)
    reset_accelerate_state()
    return output, result


def saved_tensors(output):
    """Every tensor of every safetensors file under ``output``, by file."""
    found = {}
    for path in output.rglob("*.safetensors"):
        found[path] = load_file(str(path))
    return found


def test_a_diverging_run_exits_with_3_and_leaves_only_finite_files(dataset, tmp_path, capsys):
    output = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        cli(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(output), "--dataset_repeat", "2",
                                "--num_epochs", "2", "--learning_rate", "1e6", "--save_steps", "1", "--enable_csv_log",
                                "--checkpoints_total_limit", "20"])
    assert exit_info.value.code == 3
    error = capsys.readouterr().err
    with open(output / "logs" / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    bad = [int(row["step"]) for row in rows if not math.isfinite(float(row["loss"]))]
    # The run diverged: three non-finite steps in a row (the default limit), and it stopped at the third.
    assert len(bad) == 3 and bad == list(range(bad[0], bad[0] + 3)) and int(rows[-1]["step"]) == bad[-1]
    assert float(rows[-1]["nonfinite_steps"]) == 3
    assert f"training stopped at optimizer step {bad[-1]}" in error
    assert f"step {bad[0]}: metadata {dataset / 'metadata.csv'} row " in error and "(image: image_00" in error
    files = saved_tensors(output)
    assert any(path.parent == output for path in files) and any("checkpoints" in path.parts for path in files)
    assert {path: nonfinite_names(tensors) for path, tensors in files.items() if nonfinite_names(tensors)} == {}
    # `latest` resumes from finite weights and optimizer state, and the message points at it.
    latest = resolve_checkpoint("latest", output)
    weights, optimizer_state, _, progress = load_training_state(latest)
    assert progress["global_step"] < bad[-1] and f"the last checkpoint is {latest}" in error
    moments = {f"{index}.{key}": value for index, state in optimizer_state["state"].items()
               for key, value in state.items() if isinstance(value, torch.Tensor)}
    assert moments and not nonfinite_names(weights) and not nonfinite_names(moments)


def test_a_damaged_sample_is_skipped_and_training_goes_on(poisoned_plain):
    output, result = poisoned_plain
    assert result["global_step"] == 6 and result["nonfinite_steps"] == 2
    assert sum(not math.isfinite(loss) for loss in result["losses"]) == 2
    weights = lora(output)
    assert not nonfinite_names(weights)
    assert max(weights[key].abs().max().item() for key in weights if "lora_B" in key) > 1e-4  # it trained


@pytest.mark.parametrize("mode", ["offload", "optimizer_offload", "block_swap", "fused_optimizer_offload"])
def test_skipping_gives_the_plain_lora_in_every_weight_placement(poisoned_plain, poisoned_cache, tmp_path, mode):
    # The fused step skips a NaN loss's step before its backward.
    fused = [*OFFLOAD_MODES["optimizer_offload"], "--fused_optimizer_step"]
    placement = {"block_swap": ["--blocks_to_swap", "1"], "fused_optimizer_offload": fused}.get(mode) or OFFLOAD_MODES[mode]
    result = two_epochs(poisoned_cache, tmp_path / "out", *placement)
    assert result["nonfinite_steps"] == 2
    assert max_difference(lora(tmp_path / "out"), lora(poisoned_plain[0])) < 1e-6


def test_the_stop_names_the_damaged_file_among_the_accumulated_samples(poisoned_cache, tmp_path):
    output = tmp_path / "out"
    with pytest.raises(TrainingDivergedError) as error:
        # Clipping does not hide a NaN gradient: its norm is NaN, and the guard reads clipping's norm.
        main(QwenImagePipeline, stage_two_argv(poisoned_cache, output, "--max_nonfinite_steps", "1",
                                               "--gradient_accumulation_steps", "2", "--max_grad_norm", "1.0"))
    message = str(error.value)
    assert f"cache file {poisoned_cache / '0' / f'{POISONED}.safetensors'}" in message
    assert "no training-state checkpoint was written yet" in message
    # Both samples of the accumulated step are named: the damaged one and its partner.
    step_samples = message.split("Samples: ")[1].split(". Every file")[0]
    assert step_samples.count("cache file ") == 2
    assert not list(output.rglob("*.safetensors"))


def test_the_guard_counts_runs_of_bad_steps():
    guard = NonFiniteGuard(2, skipped=5)
    assert not guard.record(1, False, ["a"]) and not guard.record(2, True)
    assert not guard.record(3, False, ["b"]) and guard.record(4, False, ["c", "c"])
    assert guard.skipped == 8 and guard.consecutive == 2
    message = str(guard.diverged(4, None, None))
    assert "steps 3 to 4" in message and "Samples: step 3: b | step 4: c." in message  # the streak only
    assert step_is_finite([torch.tensor(1.0)], torch.tensor(2.0))
    assert not step_is_finite([torch.tensor(1.0), torch.tensor(float("nan"))], None)
    assert not step_is_finite([torch.tensor(1.0)], torch.tensor(float("inf")))
    with pytest.raises(ValueError, match="--max_nonfinite_steps 0 must be at least 1"):
        NonFiniteGuard(0)

