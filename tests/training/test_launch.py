"""Under ``accelerate launch`` an error the user fixes reads as one message: no traceback from the training process,
and none from the launcher with ``--quiet`` (one process) or with ``diffsynth-launch`` / ``python -m
diffsynth.training.launch`` (any number of processes, which also exits with the process's own code). The README's
commands start with ``diffsynth-launch``, and so does ``make demo``'s training."""

import importlib
import os
import re
import shlex
import subprocess
import sys

import pytest
from accelerate.commands.launch import launch_command_parser
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from diffsynth.core.folder_lock import FolderLock
from diffsynth.training import launch as launch_module
from diffsynth.training.launch import failed_process_code
from tests.docs.test_readme import code_blocks, section
from tests.examples.test_scripts import REPO, launch_commands
from tests.launching import free_port
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
    code, output = launch(tmp_path, tiny_root, ["diffsynth.training.launch", "--multi_gpu", "--num_processes", "2",
                                                "--main_process_port", str(free_port())], flags)
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


def test_the_readme_commands_use_the_console_script_of_the_launcher():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    module, _, function = scripts["diffsynth-launch"].partition(":")
    assert getattr(importlib.import_module(module), function) is launch_module.main
    commands = [words for block in code_blocks(section("Training")) for words in launch_commands(block)]
    assert len(commands) == 3 and all(words[:2] == ["diffsynth-launch", str(TRAIN_PY.relative_to(REPO))]
                                      for words in commands)


def readme_command(dataset, tmp_path, *extra):
    """The README's first training command on the tiny models and ``dataset``, with ``extra`` flags, as the console
    script runs it (``diffsynth-launch`` is ``python -m diffsynth.training.launch``, the test above)."""
    [words, *_] = launch_commands(code_blocks(section("Training"))[1])
    words = [*words, "--output_path", str(tmp_path / "out"), *extra]
    for flag, value in (("--dataset_base_path", dataset), ("--dataset_metadata_path", dataset / "metadata.csv")):
        words[words.index(flag) + 1] = str(value)
    return [sys.executable, "-m", "diffsynth.training.launch", *words[1:]]


DEFAULTS_NOTICE = "The following values were not passed to `accelerate launch`"


def run_from_the_repo(command, tiny_root):
    env = {**os.environ, "DIFFSYNTH_MODEL_BASE_PATH": str(tiny_root), "OMP_NUM_THREADS": "1"}
    env.pop("DIFFSYNTH_DEBUG", None)
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_a_readme_command_with_a_bad_flag_ends_with_one_message_and_exit_code_2(dataset, tmp_path, tiny_root):
    done = run_from_the_repo(readme_command(dataset, tmp_path, "--lora_rank", "0"), tiny_root)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.splitlines() == [
        "train.py: error: --lora_rank 0 must be at least 1; pass e.g. --lora_rank 32",
        "train.py: run with --help for all flags",
        f"launch: {TRAIN_PY.relative_to(REPO)} exited with code 2; its message is above"]  # no notice, no usage
    assert done.stdout == ""
    debug = run_from_the_repo(readme_command(dataset, tmp_path, "--lora_rank", "0", "--debug"), tiny_root)
    assert DEFAULTS_NOTICE in debug.stderr  # the README's command leaves accelerate's options out


def test_a_tiny_readme_run_prints_no_library_notice(dataset, tmp_path, tiny_root):
    done = run_from_the_repo(readme_command(dataset, tmp_path, "--num_epochs", "1", "--max_pixels", "4096",
                                            "--lora_rank", "4"), tiny_root)
    assert done.returncode == 0, done.stderr[-3000:]
    for notice in (DEFAULTS_NOTICE, "gemm_4bit_forward", "Setting accelerator to CPU", "should be kept in float32"):
        assert notice not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr and (tmp_path / "out" / "epoch-0.safetensors").is_file()


def test_the_demo_trains_through_the_launcher_with_every_option_accelerate_would_default():
    launcher = re.search(r"^LAUNCH=\((.*?)\)$", (REPO / "scripts" / "demo.sh").read_text(), re.MULTILINE | re.DOTALL)[1]
    words = shlex.split(launcher)
    assert words[:3] == ["$PYTHON", "-m", "diffsynth.training.launch"]
    args = launch_command_parser().parse_args([*words[3:], str(TRAIN_PY)])
    # accelerate reports a default for each of these left unset (one process: not the GPU count).
    assert (args.num_processes, args.num_machines, args.mixed_precision, args.dynamo_backend) == (1, 1, "no", "no")


def test_families_prints_the_table_without_importing_a_model_library():
    from diffsynth.pipelines.families_table import family_rows, markdown_table, text_table

    code = ("import sys; from diffsynth.training.launch import main; code = main(sys.argv[1:]); "
            "heavy = sorted(m for m in ('torch', 'diffusers', 'transformers', 'accelerate') if m in sys.modules); "
            "print(f'exit {code}, heavy {heavy}')")
    for flags, table in (([], text_table), (["--format", "markdown"], markdown_table)):
        done = subprocess.run([sys.executable, "-c", code, "families", *flags], cwd=REPO, capture_output=True,
                              text=True, check=True)
        assert done.stdout == table(family_rows()) + "exit 0, heavy []\n" and done.stderr == ""


def test_the_module_entry_prints_the_families_and_rejects_a_bad_option():
    done = subprocess.run([sys.executable, "-m", "diffsynth.training.launch", "families", "--format", "markdown"],
                          cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.startswith("| family | pipeline |")
    bad = subprocess.run([sys.executable, "-m", "diffsynth.training.launch", "families", "--format", "html"],
                         cwd=REPO, capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "diffsynth-launch families: error" in bad.stderr


def test_anything_else_is_accelerate_launch(monkeypatch):
    import accelerate.commands.launch as accelerate_launch

    launched = []
    monkeypatch.setattr(accelerate_launch, "launch_command", launched.append)
    # "families" after the script is one of the script's own arguments, launched as before.
    assert launch_module.main(["--num_processes", "1", str(TRAIN_PY), "families", "--lr", "1"]) == 0
    [args] = launched
    assert args.training_script == str(TRAIN_PY) and args.training_script_args == ["families", "--lr", "1"]
    assert args.num_processes == 1
