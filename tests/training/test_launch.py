"""Under ``accelerate launch`` an error the user fixes reads as one message: no traceback from the training process,
and none from the launcher with ``--quiet`` (one process) or with ``python -m diffsynth.training.launch`` (any number
of processes, which also exits with the process's own code)."""

import os
import subprocess
import sys

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from diffsynth.core.folder_lock import FolderLock
from diffsynth.training.launch import failed_process_code
from tests.training.test_trainer import COMMON, TRAIN_PY, raw

ACCELERATE = ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
FIX_HINT = "(exit code 2; for the traceback add --debug or set DIFFSYNTH_DEBUG=1)"


def missing_image(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "metadata.csv").write_text("image,prompt\nmissing.png,a red square\n")
    return raw(folder, *COMMON, "--output_path", str(tmp_path / "out")), "missing.png does not exist", 2


def launch(tmp_path, tiny_root, launcher, flags):
    env = {**os.environ, "DIFFSYNTH_MODEL_BASE_PATH": str(tiny_root), "OMP_NUM_THREADS": "1"}
    env.pop("DIFFSYNTH_DEBUG", None)
    done = subprocess.run([sys.executable, "-m", *launcher, *ACCELERATE, str(TRAIN_PY), *flags], env=env,
                          capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


def test_accelerate_launch_quiet_keeps_the_launcher_traceback_out(tmp_path, tiny_root):
    flags, fragment, _ = missing_image(tmp_path)
    code, output = launch(tmp_path, tiny_root, ["accelerate.commands.launch", "--quiet", "--num_processes", "1"],
                          flags)
    assert code == 1 and "Traceback" not in output, output[-3000:]
    assert fragment in output and FIX_HINT in output


def a_locked_folder(tmp_path, dataset, request):
    flags = [*raw(dataset), *COMMON, "--output_path", str(tmp_path / "out")]
    (tmp_path / "out").mkdir()
    lock = FolderLock(tmp_path / "out", purpose="another run", run_id="other")
    lock.acquire()  # this test's process is alive, so the launched run must wait for it
    request.addfinalizer(lock.release)
    return flags, "is in use by run other", 2


def a_diverging_run(tmp_path, dataset):
    flags = [*raw(dataset), *COMMON, "--output_path", str(tmp_path / "out"), "--dataset_repeat", "4",
             "--learning_rate", "1e6"]
    return flags, "training stopped at optimizer step", 3


@pytest.mark.parametrize("case", ["data file", "lock", "divergence"])
def test_the_diffsynth_launcher_prints_the_message_and_exits_with_its_code(case, dataset, tmp_path, tiny_root,
                                                                          request):
    flags, fragment, expected = {"data file": lambda: missing_image(tmp_path),
                                 "lock": lambda: a_locked_folder(tmp_path, dataset, request),
                                 "divergence": lambda: a_diverging_run(tmp_path, dataset)}[case]()
    code, output = launch(tmp_path, tiny_root, ["diffsynth.training.launch", "--num_processes", "1"], flags)
    assert code == expected and "Traceback" not in output, output[-3000:]
    assert fragment in output
    assert f"launch: {TRAIN_PY} exited with code {expected}; its message is above" in output


def test_two_processes_print_one_message_and_no_traceback(tmp_path, tiny_root):
    flags, fragment, _ = missing_image(tmp_path)
    code, output = launch(tmp_path, tiny_root, ["diffsynth.training.launch", "--multi_gpu", "--num_processes", "2"],
                          flags)
    assert code == 2 and "Traceback" not in output and "ChildFailedError" not in output, output[-3000:]
    assert output.count("error: metadata ") == 1 and FIX_HINT in output  # process 0's whole message, once
    assert f"launch: {TRAIN_PY} exited with code 2; its message is above" in output


def test_debug_shows_both_tracebacks(tmp_path, tiny_root):
    flags, _, _ = missing_image(tmp_path)
    code, output = launch(tmp_path, tiny_root, ["diffsynth.training.launch", "--num_processes", "1"],
                          [*flags, "--debug"])
    assert code == 1 and "DataFileNotFoundError: metadata" in output
    assert "CalledProcessError" in output  # the launcher's own, kept with --debug


def test_the_exit_code_of_the_failed_process():
    assert failed_process_code(subprocess.CalledProcessError(3, ["train.py"])) == 3
    assert failed_process_code(subprocess.CalledProcessError(-15, ["train.py"])) == 143  # SIGTERM, as a shell says
    failures = {0: ProcessFailure(local_rank=0, pid=1, exitcode=75, error_file="<none>")}
    assert failed_process_code(ChildFailedError("train.py", failures)) == 75
    assert failed_process_code(RuntimeError("a launcher bug")) is None
