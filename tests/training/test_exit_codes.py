"""Errors a person reads: each error the user must fix ends the run with its message alone, no traceback, unless
``--debug`` or ``DIFFSYNTH_DEBUG`` asks for one; other errors keep their traceback.

Every case here is the real failure, reached through ``trainer.cli`` (the entry of every ``train.py``, which runs
``trainer.main``); ``test_launch`` checks the same under ``accelerate launch``.
"""

import shutil

import pytest
import torch
from safetensors.torch import save_file

from diffsynth.core.data import CacheError, DataFileNotFoundError, DatasetError
from diffsynth.core.finite import NonFiniteTensorError
from diffsynth.core.folder_lock import FolderLock
from diffsynth.core.loader import ModelConfigError, ModelFilesNotFoundError, ModelLoadError, resolve
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID
from diffsynth.training import cli, exit_codes
from diffsynth.training.config.errors import FlagError
from diffsynth.training.loop.nonfinite_guard import TrainingDivergedError
from diffsynth.training.outputs.checkpoint import CheckpointError, resolve_checkpoint
from tests.core.test_disk_full import fill_disk_in_save_file
from tests.training.conftest import lora
from tests.training.test_trainer import COMMON, raw, stage_two_argv


@pytest.fixture(autouse=True)
def in_process_runs(base, fresh_accelerate_state, monkeypatch):
    """Every test here runs the trainer in-process on the tiny repos, as one process, without asking for tracebacks."""
    for name in ("DIFFSYNTH_DEBUG", "RANK"):
        monkeypatch.delenv(name, raising=False)


def with_missing_image(dataset, tmp_path, monkeypatch, request):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "metadata.csv").write_text("image,prompt\nmissing.png,a red square\n")
    return raw(folder, *COMMON, "--output_path", str(tmp_path / "out")), "missing.png does not exist"


def without_rows(dataset, tmp_path, monkeypatch, request):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "metadata.csv").write_text("image,prompt\n")
    return raw(folder, *COMMON, "--output_path", str(tmp_path / "out")), "no rows"


def from_a_folder_that_is_no_cache(dataset, tmp_path, monkeypatch, request):
    (tmp_path / "not_a_cache").mkdir()
    return stage_two_argv(tmp_path / "not_a_cache", tmp_path / "out"), "is not a stage-1 cache"


def with_a_pattern_outside_the_repository(dataset, tmp_path, monkeypatch, request):
    argv = [*raw(dataset), *COMMON, "--output_path", str(tmp_path / "out")]
    argv[argv.index("--model_id_with_origin_paths") + 1] = "Qwen/Qwen-Image:../transformer/*.safetensors"
    return argv, "must be relative to its repository folder"


def with_missing_model_files(dataset, tmp_path, monkeypatch, request):
    monkeypatch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("DIFFSYNTH_SKIP_DOWNLOAD", "true")
    return [*raw(dataset), *COMMON, "--output_path", str(tmp_path / "out")], "no usable files in"


def with_a_truncated_shard(dataset, tmp_path, monkeypatch, request):
    repo = tmp_path / "models" / QWEN_IMAGE_MODEL_ID
    shutil.copytree(request.getfixturevalue("tiny_root") / QWEN_IMAGE_MODEL_ID, repo)
    shard = min((repo / "transformer").glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # an interrupted download
    monkeypatch.setenv(resolve.BASE_PATH_ENV, str(tmp_path / "models"))
    return [*raw(dataset), *COMMON, "--output_path", str(tmp_path / "out")], f"{shard} is not a valid safetensors"


def into_a_locked_folder(dataset, tmp_path, monkeypatch, request):
    (tmp_path / "out").mkdir()
    lock = FolderLock(tmp_path / "out", purpose="another run", run_id="other")
    lock.acquire()  # held by a live process (this one): a second run must be refused
    request.addfinalizer(lock.release)
    return [*raw(dataset), *COMMON, "--output_path", str(tmp_path / "out")], "is in use by run other"


def resuming_from_nothing(dataset, tmp_path, monkeypatch, request):
    return ([*raw(dataset), *COMMON, "--output_path", str(tmp_path / "out"), "--resume_from_checkpoint",
             str(tmp_path / "nope")], "no checkpoint at")


def with_a_diverging_learning_rate(dataset, tmp_path, monkeypatch, request):
    return ([*raw(dataset), *COMMON, "--output_path", str(tmp_path / "out"), "--dataset_repeat", "4",
             "--learning_rate", "1e6"], "training stopped at optimizer step")


def a_lora_with_nan(tmp_path):
    path = tmp_path / "diverged.safetensors"
    save_file({"diffusion_model.transformer_blocks.0.attn.to_q.lora_A.weight": torch.full((4, 32), float("nan")),
               "diffusion_model.transformer_blocks.0.attn.to_q.lora_B.weight": torch.zeros(32, 4)}, str(path))
    return path


def from_a_lora_with_nan(dataset, tmp_path, monkeypatch, request):
    return ([*raw(dataset), *COMMON, "--output_path", str(tmp_path / "out"), "--lora_checkpoint",
             str(a_lora_with_nan(tmp_path))], "written by a diverged run?")


CASES = {
    DataFileNotFoundError: with_missing_image, DatasetError: without_rows, CacheError: from_a_folder_that_is_no_cache,
    ModelConfigError: with_a_pattern_outside_the_repository, ModelFilesNotFoundError: with_missing_model_files,
    ModelLoadError: with_a_truncated_shard,
    FlagError: into_a_locked_folder, CheckpointError: resuming_from_nothing,
    TrainingDivergedError: with_a_diverging_learning_rate, NonFiniteTensorError: from_a_lora_with_nan,
}  # fmt: skip


def run_cli(argv):
    with pytest.raises(SystemExit) as exit_info:
        cli(QwenImagePipeline, argv)
    return exit_info.value.code


@pytest.mark.parametrize("error_class", list(CASES), ids=lambda error_class: error_class.__name__)
def test_each_error_the_user_fixes_prints_its_message_without_a_traceback(error_class, dataset, tmp_path,
                                                                          monkeypatch, request, capsys):
    argv, fragment = CASES[error_class](dataset, tmp_path, monkeypatch, request)
    code = run_cli(argv)
    err = capsys.readouterr().err
    assert code == (3 if error_class in (TrainingDivergedError, NonFiniteTensorError) else 2), err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    message = err[err.index("error: "):]
    assert fragment in message
    assert message.rstrip().endswith(f"(exit code {code}; for the traceback add --debug or set DIFFSYNTH_DEBUG=1)")


def test_a_lora_with_nan_has_one_exit_code_through_either_flag(dataset, tmp_path, capsys):
    """The cause decides the code: a non-finite file is 3 whether it continues the LoRA or is merged as a preset."""
    path = a_lora_with_nan(tmp_path)
    code = run_cli([*raw(dataset), *COMMON, "--output_path", str(tmp_path / "out"), "--preset_lora_path", str(path),
                    "--preset_lora_model", "dit"])
    err = capsys.readouterr().err
    assert code == exit_codes.NON_FINITE and "Traceback" not in err, err[-2000:]
    assert f"error: --preset_lora_path {path}: LoRA" in err and "NaN or inf values" in err


@pytest.mark.parametrize("writing", ["checkpoint", "LoRA"])
def test_a_full_disk_names_the_file_and_the_space_and_leaves_the_earlier_files(writing, dataset, tmp_path,
                                                                               monkeypatch, capsys):
    output = tmp_path / "out"
    # Step 2's save runs out of space: its checkpoint's optimizer state (after its weights, in the staging folder),
    # or its LoRA file.
    failing = {"checkpoint": "/.step-2.tmp/.state.safetensors.", "LoRA": "/out/.step-2.safetensors."}[writing]
    fill_disk_in_save_file(monkeypatch, lambda path: failing in path)
    code = run_cli([*raw(dataset), *COMMON, "--output_path", str(output), "--num_epochs", "1", "--save_steps", "1"])
    err = capsys.readouterr().err
    assert code == exit_codes.DISK_FULL and "Traceback" not in err, err[-2000:]
    names = {"checkpoint": f"checkpoint {output / 'checkpoints' / 'step-2'} needs about",
             "LoRA": f"writing {output / 'step-2.safetensors'} needs"}
    assert f"error: no space left on the disk: {names[writing]}" in err and " are free in " in err
    assert "intact" in err and f"(exit code {exit_codes.DISK_FULL};" in err
    assert not list(output.rglob("*.tmp")) and not list(output.rglob(".*.tmp*"))  # no staging folder, no partial file
    assert resolve_checkpoint("latest", output) == output / "checkpoints" / "step-1"
    assert lora(output, "step-1")  # the earlier LoRA file reads back


@pytest.mark.parametrize("ask", ["flag", "environment"])
def test_debug_shows_the_traceback(ask, dataset, tmp_path, monkeypatch, request, capsys):
    argv, _ = with_missing_image(dataset, tmp_path, monkeypatch, request)
    if ask == "flag":
        argv.append("--debug")
    else:
        monkeypatch.setenv("DIFFSYNTH_DEBUG", "1")
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "DataFileNotFoundError: metadata" in err


def test_other_errors_keep_their_traceback(capsys):
    def bug():
        raise KeyError("a bug")

    assert exit_codes.run_with_exit_code(bug) == exit_codes.FAILED
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_only_the_first_process_prints_the_whole_message(monkeypatch, capsys):
    error = FlagError(["--lora_rank 0 must be at least 1; pass e.g. --lora_rank 32", "--num_epochs 0 ..."])
    monkeypatch.setenv("RANK", "3")
    exit_codes.report_error(error)
    assert capsys.readouterr().err == ("[rank 3] error (exit code 2): --lora_rank 0 must be at least 1; pass e.g. "
                                       "--lora_rank 32\n")


@pytest.mark.parametrize("value, wanted", [("", False), ("0", False), ("off", False), ("1", True), ("yes", True)])
def test_debug_is_read_from_the_flag_or_the_environment(value, wanted, monkeypatch):
    monkeypatch.setenv("DIFFSYNTH_DEBUG", value)
    assert exit_codes.debug_requested(["--lora_rank", "4"]) is wanted
    assert exit_codes.debug_requested(["--lora_rank", "4", "--debug"])
