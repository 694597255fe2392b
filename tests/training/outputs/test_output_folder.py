"""One run per output folder, through ``trainer.main`` on the tiny Qwen-Image: the lock, earlier runs' outputs,
``--overwrite_output``, metrics and pruning across a resume, the resume fallback and flag checks, and the writability
check, each before any model loads where the issue asks for it.
"""

import csv
import json
import logging
import os
import shutil
import subprocess
import sys
import types
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from diffsynth.core.folder_lock import LOCK_FILE, LockHolder
from diffsynth.core.loader import loading
from diffsynth.core.written_files import start_recording
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.training.config.errors import FlagError
from diffsynth.training.config.parsers import build_parser
from diffsynth.training.entry import main
from diffsynth.training.outputs.checkpoint import CheckpointError
from diffsynth.training.outputs.earlier_outputs import earlier_outputs
from diffsynth.training.outputs.logger import ModelLogger
from diffsynth.training.outputs.output_folder import TRAINING_OUTPUTS, previous_outputs
from tests.training.test_trainer import COMMON, PATTERN, lora, max_difference, raw
from tests.launching import accelerate_launch

TRAIN_PY = "examples/qwen_image/model_training/train.py"


@pytest.fixture(autouse=True)
def in_process_runs(base, fresh_accelerate_state):
    """Every test here runs the trainer in-process on the tiny repos."""


@pytest.fixture
def no_model_loads(monkeypatch):
    """Fails the test if any model weights are loaded."""
    monkeypatch.setattr(loading, "load_model_from_files", lambda *a, **k: pytest.fail("a model was loaded"))


def train(dataset, output, *extra):
    """One-stage training: 3 images x 2 repeats x 2 epochs = 12 optimizer steps."""
    return main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(output), "--dataset_repeat", "2",
                                    "--num_epochs", "2", *extra])


def metric_steps(output):
    with open(output / "logs" / "metrics.csv", newline="") as handle:
        return [int(row["step"]) for row in csv.DictReader(handle)]


def live_lock(folder, **changes):
    """A lock as a run in this very process would hold it (its pid is alive)."""
    folder.mkdir(parents=True, exist_ok=True)
    holder = replace(LockHolder.this_process("other-run", "--task sft"), **changes)
    (folder / LOCK_FILE).write_text(json.dumps(asdict(holder)))
    return holder


def test_a_second_run_into_a_held_folder_is_refused_before_models_load(dataset, tmp_path, monkeypatch):
    output = tmp_path / "out"
    holder = live_lock(output)
    monkeypatch.setattr(loading, "load_model_from_files", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(FlagError) as refused:
        train(dataset, output)
    message = str(refused.value)
    assert f"--output_path {output} is in use by run other-run (--task sft), process {holder.pid} on host " \
           f"{holder.host}" in message
    assert "choose another --output_path" in message and f"delete {output / LOCK_FILE}" in message
    assert sorted(os.listdir(output)) == [LOCK_FILE]  # nothing written, the other run's lock untouched


def test_a_stale_lock_is_taken_over_and_the_run_goes_on(dataset, tmp_path, caplog):
    output = tmp_path / "out"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    live_lock(output, pid=int(dead.stdout), pid_start=None)
    with caplog.at_level(logging.WARNING):
        result = train(dataset, output, "--num_epochs", "1")
    assert result["global_step"] == 6 and "taking over the stale lock" in caplog.text
    assert not (output / LOCK_FILE).exists()  # released at the end


def test_a_lock_is_released_when_the_run_fails(dataset, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(loading, "load_model_from_files", broken)
    with pytest.raises(RuntimeError, match="disk on fire"):
        train(dataset, tmp_path / "runs" / "out")
    # Created by this run, nothing written: removed again, with the parent it created.
    assert not (tmp_path / "runs").exists()


def test_a_new_run_in_an_old_runs_folder_is_refused_then_overwrite_or_resume_work(dataset, tmp_path, monkeypatch):
    output = tmp_path / "out"
    first = train(dataset, output, "--max_train_steps", "5", "--save_steps", "2", "--enable_csv_log")
    run_id = json.loads((output / "training_args.json").read_text())["run_id"]
    assert first["global_step"] == 5 and json.loads((output / "checkpoints" / "step-5" / "progress.json")
                                                   .read_text())["run_id"] == run_id
    (output / "notes.txt").write_text("mine")
    with monkeypatch.context() as patch:
        patch.setattr(loading, "load_model_from_files", lambda *a, **k: pytest.fail("a model was loaded"))
        with pytest.raises(FlagError) as refused:
            train(dataset, output, "--enable_csv_log")
    message = str(refused.value)
    assert f"--output_path {output} holds the outputs of an earlier run (run {run_id}): " in message
    assert "14 files, " in message and "logs/report.html and 6 more" in message and "logs/metrics.csv" in message
    assert "step-2.safetensors" in message
    assert "--resume_from_checkpoint latest" in message and "--overwrite_output" in message
    # Resuming continues the same run.
    resumed = train(dataset, output, "--resume_from_checkpoint", "latest", "--enable_csv_log")
    assert resumed["global_step"] == 12 and metric_steps(output) == list(range(1, 13))
    assert json.loads((output / "training_args.json").read_text())["run_id"] == run_id
    # Overwriting removes the trainer's files only, then starts afresh with a new run id.
    fresh = train(dataset, output, "--overwrite_output", "--num_epochs", "1", "--enable_csv_log")
    assert fresh["global_step"] == 6 and metric_steps(output) == list(range(1, 7))
    assert sorted(os.listdir(output)) == [".diffsynth", "checkpoints", "config.yaml", "epoch-0.safetensors", "logs",
                                          "notes.txt", "training_args.json"]
    assert sorted(os.listdir(output / "checkpoints")) == ["step-6"]
    assert json.loads((output / "training_args.json").read_text())["run_id"] != run_id


def test_metrics_after_a_resume_have_each_step_once(dataset, tmp_path):
    output = tmp_path / "out"
    train(dataset, output, "--max_train_steps", "8", "--save_steps", "5", "--checkpoints_total_limit", "3",
          "--enable_csv_log")
    assert metric_steps(output) == list(range(1, 9))
    train(dataset, output, "--resume_from_checkpoint", str(output / "checkpoints" / "step-5"), "--enable_csv_log")
    assert metric_steps(output) == list(range(1, 13))


def test_pruning_keeps_checkpoints_of_other_runs(dataset, tmp_path):
    other, output = tmp_path / "other", tmp_path / "out"
    train(dataset, other, "--max_train_steps", "3")
    foreign = output / "checkpoints" / "step-50"  # a higher step than this run reaches, of another run
    shutil.copytree(other / "checkpoints" / "step-3", foreign)
    progress = json.loads((foreign / "progress.json").read_text())
    (foreign / "progress.json").write_text(json.dumps({**progress, "global_step": 50, "run_id": "someone-else"}))
    train(dataset, output, "--resume_from_checkpoint", str(other / "checkpoints" / "step-3"), "--save_steps", "2",
          "--checkpoints_total_limit", "1")
    assert sorted(os.listdir(output / "checkpoints")) == ["step-12", "step-50"]


def test_an_unreadable_latest_checkpoint_falls_back_to_the_previous_one(dataset, tmp_path, caplog):
    train(dataset, tmp_path / "whole")
    output = tmp_path / "out"
    train(dataset, output, "--max_train_steps", "7", "--save_steps", "3")
    latest = output / "checkpoints" / "step-7"
    data = (latest / "trainable.safetensors").read_bytes()
    (latest / "trainable.safetensors").write_bytes(data[:len(data) // 2])
    with caplog.at_level(logging.WARNING):
        resumed = train(dataset, output, "--resume_from_checkpoint", "latest")
    assert f"skipping unreadable {latest} (trainable.safetensors" in caplog.text
    assert f"resuming from {output / 'checkpoints' / 'step-6'} instead" in caplog.text
    assert len(resumed["losses"]) == 6  # steps 7 to 12
    assert max_difference(lora(output), lora(tmp_path / "whole")) < 1e-6


def test_an_unreadable_named_checkpoint_is_named(dataset, tmp_path, no_model_loads):
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "progress.json").write_text("{")
    with pytest.raises(CheckpointError, match=f"--resume_from_checkpoint {folder}: the checkpoint is unreadable "
                                              r"\(.*progress.json: JSONDecodeError"):
        train(dataset, tmp_path / "out", "--resume_from_checkpoint", str(folder))


def test_resuming_with_another_rank_or_targets_names_both_values_before_models_load(dataset, tmp_path, monkeypatch):
    output = tmp_path / "out"
    train(dataset, output, "--max_train_steps", "2")
    monkeypatch.setattr(loading, "load_model_from_files", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(FlagError) as refused:
        train(dataset, output, "--resume_from_checkpoint", "latest", "--lora_rank", "8", "--lora_target_modules",
              "to_q,to_k")
    problems = refused.value.problems
    checkpoint = output / "checkpoints" / "step-2"
    assert any(problem.startswith(f"--lora_rank 8: the checkpoint {checkpoint} was trained with --lora_rank 4; "
                                  "resume with --lora_rank 4") for problem in problems), problems
    assert any(problem.startswith("--lora_target_modules to_k,to_q: the checkpoint") and
               "--lora_target_modules add_q_proj,img_mlp.net.2,to_k,to_out.0,to_q,to_v,txt_mod.1" in problem
               for problem in problems), problems


def test_a_checkpoint_without_recorded_flags_still_names_the_shapes(dataset, tmp_path):
    output = tmp_path / "out"
    train(dataset, output, "--max_train_steps", "2")
    progress_file = output / "checkpoints" / "step-2" / "progress.json"
    progress = json.loads(progress_file.read_text())
    del progress["flags"]  # as an older checkpoint has it
    progress_file.write_text(json.dumps(progress))
    with pytest.raises(ValueError, match=r"--resume_from_checkpoint .*step-2: the checkpoint's .* has shape \(4, "
                                         r".*\(8, .*resume with the\s+--lora_rank"):
        train(dataset, output, "--resume_from_checkpoint", "latest", "--lora_rank", "8")


@pytest.fixture
def read_only_folder(tmp_path):
    """An existing folder this process cannot write into (chmod; for root, which ignores modes, chattr +i)."""
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o555)
    immutable = False
    if os.access(folder, os.W_OK):  # root
        immutable = subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
    probe = folder / "probe"
    try:
        probe.write_text("")
    except OSError:
        pass
    else:
        probe.unlink()
        folder.chmod(0o755)
        pytest.skip("cannot make a read-only folder here (root without chattr)")
    yield folder
    if immutable:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    folder.chmod(0o755)


def test_a_read_only_output_folder_is_refused_before_models_load(dataset, read_only_folder, no_model_loads):
    with pytest.raises(FlagError) as refused:
        train(dataset, read_only_folder)
    message = str(refused.value)
    assert f"--output_path {read_only_folder} is not writable (PermissionError" in message
    assert "choose a folder you can write to" in message


def test_stage_one_reruns_into_its_cache_but_not_beside_a_live_run(dataset, tmp_path, no_model_loads):
    # (The rerun itself is covered in test_trainer: rerunning stage 1 skips cached samples.)
    cache = tmp_path / "cache"
    (cache / "0").mkdir(parents=True)
    (cache / "cache_info.json").write_text("{}")
    (cache / "0" / "0.safetensors").write_bytes(b"")
    live_lock(cache)
    with pytest.raises(FlagError, match=f"--output_path {cache} is in use by run other-run"):
        main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(cache), "--task", "sft:data_process",
                                 "--offload_models", PATTERN["dit"]])


def test_stage_one_overwrite_removes_only_the_cache(dataset, tmp_path):
    cache = tmp_path / "cache"
    argv = [*raw(dataset), *COMMON, "--output_path", str(cache), "--task", "sft:data_process", "--offload_models",
            PATTERN["dit"]]
    assert main(QwenImagePipeline, argv)["cached"] == 3
    (cache / "README.txt").write_text("mine")
    assert main(QwenImagePipeline, argv)["cached"] == 0  # a rerun needs no flag
    assert main(QwenImagePipeline, [*argv, "--overwrite_output"])["cached"] == 3
    assert (cache / "README.txt").read_text() == "mine"


def test_the_default_output_folder_is_not_the_model_folder(dataset, tmp_path, base, no_model_loads):
    from diffsynth.core.loader import model_base_path

    default = build_parser().get_default("output_path")
    assert os.path.abspath(default) != os.path.abspath("./models")
    with pytest.raises(FlagError, match=f"--output_path {base} is the model folder"):
        train(dataset, model_base_path())


def test_two_processes_both_stop_at_a_held_folder_without_loading_models(dataset, tmp_path, tiny_root):
    output = tmp_path / "out"
    live_lock(output, pid=os.getpid())  # this test process holds it for the launched run
    command = [*accelerate_launch(2), TRAIN_PY, *raw(dataset),
               *COMMON, "--output_path", str(output)]
    env = {**os.environ, "DIFFSYNTH_MODEL_BASE_PATH": str(tiny_root), "OMP_NUM_THREADS": "1"}
    repo = Path(__file__).resolve().parents[3]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180, cwd=repo)
    assert done.returncode != 0
    assert done.stderr.count(f"--output_path {output} is in use by run other-run") >= 2, done.stderr[-3000:]
    assert "the main process refused to start" in done.stderr  # rank 1 learnt the verdict from rank 0
    assert "Loading" not in done.stderr and sorted(os.listdir(output)) == [LOCK_FILE]


def test_the_loss_chart_is_one_of_the_files_a_run_writes(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    for name in ("loss.png", ".loss.png.k2j4.tmp", "my_plot.png"):
        (logs / name).write_bytes(b"")
    assert previous_outputs(tmp_path, TRAINING_OUTPUTS) == [logs / ".loss.png.k2j4.tmp", logs / "loss.png"]


def test_diffusers_twins_and_samples_are_files_a_run_writes(tmp_path):
    for folder in ("samples/step-10", "samples/notes", "checkpoints/step-3"):
        (tmp_path / folder).mkdir(parents=True)
    names = ("step-10.diffusers.safetensors", ".epoch-0.diffusers.safetensors.x1.tmp", "mine.diffusers.safetensors",
             "samples/step-10/00.png", "samples/step-10/photo.png", "samples/notes/00.png",
             "checkpoints/step-3/progress.json", "checkpoints/step-3/note.txt")
    for name in names:
        (tmp_path / name).write_bytes(b"")
    # Files, not folders: a file of someone else's inside a folder of the trainer's has no trainer name.
    assert previous_outputs(tmp_path, TRAINING_OUTPUTS) == [
        tmp_path / ".epoch-0.diffusers.safetensors.x1.tmp", tmp_path / "checkpoints" / "step-3" / "progress.json",
        tmp_path / "samples" / "step-10" / "00.png", tmp_path / "step-10.diffusers.safetensors"]


def listed_files(message, output):
    """The paths a refusal lists after "<N> files, " (up to the cap), relative to ``output``."""
    names = message.split(" files, ", 1)[1].split(";", 1)[0].split(" and ", 1)[0].split(", ")
    return [output / name for name in names]


def test_overwrite_removes_the_trainers_files_and_keeps_every_other_byte(dataset, tmp_path):
    output = tmp_path / "out"
    (tmp_path / "prompts.txt").write_text("a red square\n")
    train(dataset, output, "--max_train_steps", "4", "--save_steps", "2", "--enable_csv_log", "--validation_prompts",
          str(tmp_path / "prompts.txt"), "--validation_num_inference_steps", "1", "--validation_steps", "2")
    assert (output / "samples" / "step-2" / "00.png").is_file() and (output / "checkpoints" / "step-4").is_dir()
    foreign = {  # another experiment's events, a user's photo and note in the trainer's folders, another tool's file
        "logs/tensorboard/events.out.tfevents.1700000000.otherhost.7.0": b"\x18\x00other experiment",
        "samples/step-2/photo.png": b"my photo",
        "checkpoints/step-4/note.txt": b"good run, keep",
        "epoch-3.safetensors": b"written by another tool",
    }
    for name, content in foreign.items():
        (output / name).parent.mkdir(parents=True, exist_ok=True)
        (output / name).write_bytes(content)
    (output / "step-2.safetensors").write_bytes(b"the user's replacement")  # changed since: no longer the trainer's
    with pytest.raises(FlagError) as refused:
        train(dataset, output)
    message = str(refused.value)
    # Files, not folders, with their total; the foreign ones are named as kept, never as the run's.
    assert all(path.is_file() for path in listed_files(message, output)), message
    assert " 14 files, " in message and "and 6 more" in message, message  # logs/report.html among them
    assert "keeps 3 files with the names of trainer outputs" in message and "epoch-3.safetensors" in message
    fresh = train(dataset, output, "--overwrite_output", "--max_train_steps", "3", "--enable_csv_log")
    assert fresh["global_step"] == 3 and metric_steps(output) == [1, 2, 3]
    for name, content in {**foreign, "step-2.safetensors": b"the user's replacement"}.items():
        assert (output / name).read_bytes() == content, name
    assert sorted(os.listdir(output / "checkpoints")) == ["step-3", "step-4"]
    assert os.listdir(output / "checkpoints" / "step-4") == ["note.txt"]
    assert os.listdir(output / "samples") == ["step-2"] and os.listdir(output / "samples" / "step-2") == ["photo.png"]
    assert not (output / "step-4.safetensors").exists() and (output / "step-3.safetensors").is_file()
    # The new run's files are recorded in turn: a third run is refused over exactly those.
    with pytest.raises(FlagError, match=r"holds the outputs of an earlier run \(run [0-9a-f]+\): 9 files, "):
        train(dataset, output)


def test_a_folder_from_before_the_record_is_cleaned_by_the_trainers_marks(dataset, tmp_path, monkeypatch):
    output = tmp_path / "out"
    train(dataset, output, "--max_train_steps", "2", "--enable_csv_log")
    shutil.rmtree(output / ".diffsynth")  # as a version without the record left it
    (output / "step-9.safetensors").write_bytes(b"written by another tool")
    with monkeypatch.context() as patch:
        patch.setattr(loading, "load_model_from_files", lambda *a, **k: pytest.fail("a model was loaded"))
        with pytest.raises(FlagError) as refused:  # the logs carry no mark, and a new run would write over them
            train(dataset, output, "--overwrite_output")
    message = str(refused.value)
    assert f"cd {output} && rm logs/loss.png logs/metrics.csv" in message and "nothing was removed" in message
    assert (output / "step-2.safetensors").is_file()
    (output / "logs" / "metrics.csv").unlink()
    (output / "logs" / "loss.png").unlink()
    train(dataset, output, "--overwrite_output", "--max_train_steps", "1")
    assert (output / "step-9.safetensors").read_bytes() == b"written by another tool"
    assert not (output / "step-2.safetensors").exists() and (output / "step-1.safetensors").is_file()
    assert sorted(os.listdir(output / "checkpoints")) == ["step-1"]


def test_resuming_latest_without_a_checkpoint_names_the_whole_fix(dataset, tmp_path, no_model_loads):
    output = tmp_path / "out"
    output.mkdir()
    (output / "training_args.json").write_text(json.dumps({"run_id": "abc123"}))
    with pytest.raises(CheckpointError) as refused:
        train(dataset, output, "--resume_from_checkpoint", "latest")
    message = str(refused.value)
    assert "drop --resume_from_checkpoint and add --overwrite_output" in message and "training_args.json" in message
    assert "drop the flag to start afresh" not in message


def test_the_logs_a_run_appends_to_are_recorded_as_its_own(tmp_path, monkeypatch):
    class EventsWriter:  # as TensorBoard's SummaryWriter does: opens its events file at once, then appends
        def __init__(self, log_dir, **kwargs):
            os.makedirs(log_dir, exist_ok=True)
            self.path = Path(log_dir) / f"events.out.tfevents.{os.getpid()}.here"
            self.path.write_bytes(b"file version")

        def add_scalar(self, key, value, step):
            with open(self.path, "ab") as handle:
                handle.write(f"{key}={value}@{step}".encode())

        def flush(self):
            pass

        def close(self):
            pass

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=EventsWriter))
    foreign = tmp_path / "logs" / "tensorboard" / "events.out.tfevents.1700000000.otherhost.7.0"
    foreign.parent.mkdir(parents=True)
    foreign.write_bytes(b"another experiment")
    recording = start_recording(tmp_path, "run1")
    try:
        with ModelLogger(tmp_path, enable_tensorboard_log=True, enable_csv_log=True) as model_logger:
            for step in (1, 2, 3):
                model_logger.log_metrics(step, {"loss": 0.5})
    finally:
        recording.stop()
    earlier = earlier_outputs(tmp_path, TRAINING_OUTPUTS)
    assert earlier.ours == [tmp_path / "logs" / "metrics.csv",
                            tmp_path / "logs" / "tensorboard" / f"events.out.tfevents.{os.getpid()}.here"]
    assert earlier.others == [foreign]


def test_resuming_a_folder_from_before_the_record_records_the_earlier_files(dataset, tmp_path):
    output = tmp_path / "out"
    train(dataset, output, "--max_train_steps", "2", "--save_steps", "1")
    shutil.rmtree(output / ".diffsynth")  # as a version without the record left it
    train(dataset, output, "--resume_from_checkpoint", "latest", "--max_train_steps", "3")
    ours = earlier_outputs(output, TRAINING_OUTPUTS).ours
    assert output / "step-1.safetensors" in ours and output / "checkpoints" / "step-2" / "progress.json" in ours
    assert output / "step-3.safetensors" in ours
