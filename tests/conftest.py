"""Suite-wide rules and fixtures: slow tests marked ``slow``, GPU tests skipped without CUDA, the tiny model repos,
no network access, and temporary files only under pytest's temporary folder."""

import importlib.util
import logging
import os
import multiprocessing
import shutil
import subprocess
import sys
import tempfile
import types
import warnings
from pathlib import Path

import diffsynth  # noqa: I001  (first: importing it keeps the libraries' import-time notices out of the test output)
import pytest
import torch
from filelock import FileLock
import torch.multiprocessing as mp
from diffusers import DiffusionPipeline

from diffsynth.core.loader import resolve
from diffsynth.testing.tiny_models import build_tiny_models
from diffsynth.training import command_line, entry

REPO = Path(__file__).resolve().parents[1]

@pytest.hookimpl(trylast=True)  # after pytest's own set-up of its temporary folder
def pytest_configure(config):
    """What the tests write goes under pytest's temporary folder, where their ``tmp_path`` folders are: temporary
    files of the test process and of every process it starts (``TMPDIR``; torch's elastic launcher leaves a folder
    per ``accelerate launch`` behind), Hypothesis' storage (else ``.hypothesis`` in the working folder, written while
    the tests are collected), and the CPU op DeepSpeed compiles when a run starts under it (else in
    ``~/.cache/torch_extensions``): ``make setup`` builds it once into the environment (``torch_extensions`` beside
    its ``bin``), where the runs load it; an environment without it builds it once per session (about 45 CPU
    seconds, whatever the number of workers). The planner keeps no dry runs between plans (``DIFFSYNTH_PLAN_CACHE``):
    each test plans from scratch, and nothing is written to the home folder."""
    folders = config._tmp_path_factory  # what the tmp_path_factory fixture returns, here before any fixture
    patch = pytest.MonkeyPatch()
    config.add_cleanup(patch.undo)
    patch.setenv("TMPDIR", str(folders.mktemp("tmp")))
    patch.setenv("HYPOTHESIS_STORAGE_DIRECTORY", str(folders.mktemp("hypothesis")))
    prebuilt = Path(sys.prefix) / "torch_extensions"  # the Makefile's setup step builds it there
    # Else one build for the session: pytest-xdist's workers share their parent folder (torch locks a build).
    session = folders.getbasetemp().parent if hasattr(config, "workerinput") else folders.getbasetemp()
    patch.setenv("TORCH_EXTENSIONS_DIR", str(prebuilt if prebuilt.is_dir() else session / "torch_extensions"))
    patch.setenv("DIFFSYNTH_PLAN_CACHE", "off")
    patch.setattr(tempfile, "tempdir", None)  # tempfile reads TMPDIR again


# What the ``slow`` rule of ``pytest_collection_modifyitems`` looks for in a test's code.
TRAINER_RUNS = (entry.main, command_line.cli)
CHILD_PROCESSES = (
    subprocess.run, subprocess.Popen, subprocess.call, subprocess.check_call, subprocess.check_output,
    multiprocessing.Process, multiprocessing.Pool, multiprocessing.Manager, mp.spawn, mp.start_processes,
)
# Modules whose tests start child processes where their code cannot show it: a fixture picked by name at run time.
SLOW_MODULES = (
    "tests/training/placement/test_shared_host_weights.py",  # request.getfixturevalue(f"{family}_runs")
    "tests/training/test_multi_machine.py",  # its processes start in the Launch class's __init__, a method
)
# A test function parametrized into this many items or more that builds a model is a model grid.
MODEL_GRID_SIZE = 8
# The longest modules, longest first (--durations on the 2-core machine, 2026-12-07: 170 to 590 s each of 5200 s),
# collected first. ``make test`` hands whole modules to the workers in collection order (``--dist loadscope
# --no-loadscope-reorder``; xdist's own reorder puts modules with few tests last, and so its longest ones, which then
# ran alone at the end). The DeepSpeed module leads: where ``make setup`` has not prebuilt DeepSpeed's CPU op, its
# first run builds it while the other runs wait on torch's lock, and the other worker plans meanwhile.
FIRST_MODULES = (
    "tests/training/test_trainer_deepspeed.py",
    "tests/pipelines/test_family_kit_planner.py",
    "tests/examples/test_multi_process_scripts.py",
    "tests/training/test_launch.py",
    "tests/training/test_multi_machine.py",
    "tests/core/planning/test_shallow.py",
    "tests/training/placement/test_shared_host_weights.py",
    "tests/training/test_trainer.py",
    "tests/core/loader/test_shared_loading.py",
    "tests/examples/test_qwen_reference_scripts.py",
    "tests/training/loop/test_soak.py",
)


def is_slow_call(value) -> bool:
    return any(value is call for call in (*TRAINER_RUNS, *CHILD_PROCESSES)) or is_reference_pipeline(value)


def is_reference_pipeline(value) -> bool:
    """A diffusers pipeline class: a test that runs one runs whole pipelines (inference parity with diffusers)."""
    return isinstance(value, type) and issubclass(value, DiffusionPipeline)


def is_model_class(value) -> bool:
    return isinstance(value, type) and issubclass(value, torch.nn.Module)


def named_values(function, name: str) -> list:
    """What ``name`` in ``function`` stands for: a global or a module it imports (``sys.modules``: an import inside
    the function), the function a decorator wraps (``functools.lru_cache``), the values of a dict, list or tuple."""
    value = function.__globals__.get(name, sys.modules.get(name))
    values = list(value.values()) if isinstance(value, dict) else list(value) if isinstance(value, (list, tuple)) \
        else [value]
    wrapped = [None if isinstance(value, types.ModuleType) else getattr(value, "__wrapped__", None) for value in values]
    return [inner if isinstance(inner, types.FunctionType) else value for value, inner in zip(values, wrapped)]


def names_reach(function, predicate, seen: set) -> bool:
    """Whether ``function`` (its nested functions and lambdas included) names a value ``predicate`` accepts
    (``named_values``), an attribute of a module it names (of a module among those, and so on), or a function of the
    tests package that does."""
    if function in seen:
        return False
    seen.add(function)
    names, codes = set(), [function.__code__]
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes.extend(constant for constant in code.co_consts if isinstance(constant, types.CodeType))
    values, modules = [value for name in names for value in named_values(function, name)], set()
    while values:
        value = values.pop()
        if isinstance(value, types.ModuleType):
            if value not in modules:  # the attributes it names of a module it names: torch.nn.Linear, entry.main
                modules.add(value)
                values.extend(vars(value).get(attribute) for attribute in names)  # vars: no lazy import
                # diffusers exports its pipelines lazily: a test that imports one inside a fixture names it so.
                values.extend(getattr(value, attribute) for attribute in names
                              if attribute.endswith("Pipeline") and attribute not in vars(value)
                              and value.__name__ == "diffusers" and attribute in dir(value))
        elif predicate(value) or (isinstance(value, types.FunctionType) and value.__module__.split(".")[0] == "tests"
                                  and names_reach(value, predicate, seen)):
            return True
    return False


def reaches(item, predicate) -> bool:
    """Whether the test function of ``item``, a function it is parametrized with, or a fixture it uses reaches a
    value ``predicate`` accepts (``names_reach``)."""
    parameters = getattr(item, "callspec", None)
    functions = [item.function, *(value for value in (parameters.params.values() if parameters else ())
                                  if isinstance(value, types.FunctionType))]
    # pytest's record of the fixtures an item uses; the last definition of a name is the one in effect.
    functions += [definitions[-1].func for definitions in item._fixtureinfo.name2fixturedefs.values()]
    seen = set()
    return any(names_reach(function, predicate, seen) for function in functions)


def model_grid_repeats(items) -> list:
    """The items of each model grid among ``items`` after its first one."""
    grids = {}
    for item in items:
        if hasattr(item, "callspec"):
            grids.setdefault((item.parent.nodeid, item.originalname), []).append(item)
    return [repeat for grid in grids.values() if len(grid) >= MODEL_GRID_SIZE
            and reaches(grid[0], is_model_class) for repeat in grid[1:]]


def first_modules_first(item) -> int:
    """The sort key that collects ``FIRST_MODULES`` first, in their order (a stable sort keeps the rest's)."""
    module = item.nodeid.split("::", 1)[0]
    return FIRST_MODULES.index(module) if module in FIRST_MODULES else len(FIRST_MODULES)


def pytest_collection_modifyitems(config, items):
    """Collects ``FIRST_MODULES`` first, marks the slow tests ``slow`` (``make test-fast`` leaves them out), and
    skips ``gpu`` tests without CUDA.

    Slow by rule, so that no test has to be decorated to leave the fast loop:

    - a whole trainer run in-process: the test reaches ``entry.main`` or ``command_line.cli``;
    - a whole pipeline run of diffusers' own (the reference of an inference parity test): the test reaches a
      ``diffusers.DiffusionPipeline`` class;
    - a child process: the test reaches ``subprocess`` (``run``, ``Popen``, ``call``, ``check_call``,
      ``check_output``) or ``multiprocessing`` / ``torch.multiprocessing`` (``Process``, ``Pool``, ``Manager``,
      ``spawn``, ``start_processes``), as ``accelerate launch``, ``train.py`` and spawned ranks are started; or the
      test is in ``SLOW_MODULES``;
    - a model grid's repeats: a test function parametrized into ``MODEL_GRID_SIZE`` items or more that builds a
      model (it reaches an ``nn.Module`` class) is slow after its first item, so that the fast loop still runs each
      of its assertions once.

    A test reaches a value when its function, a function it is parametrized with or one of its fixtures names it, or
    names a function of the tests package that reaches it (read from the code, nothing is run). Using
    ``fresh_accelerate_state`` is no sign: modules request it for all their tests, flag checks included.
    ``@pytest.mark.slow`` makes any test slow; ``@pytest.mark.fast`` keeps one out of the rule.
    """
    missing = [module for module in FIRST_MODULES if not (REPO / module).is_file()]
    if missing:
        raise pytest.UsageError(f"FIRST_MODULES of tests/conftest.py names {missing}, which do not exist: rename or "
                                "drop them there")
    items.sort(key=first_modules_first)
    ruled = [item for item in items if not item.get_closest_marker("fast") and not item.get_closest_marker("slow")]
    for item in [item for item in ruled if item.nodeid.startswith(SLOW_MODULES) or reaches(item, is_slow_call)]:
        item.add_marker(pytest.mark.slow)
    for item in model_grid_repeats([item for item in ruled if not item.get_closest_marker("slow")]):
        item.add_marker(pytest.mark.slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    """A model base folder holding every family's tiny repos. Read-only: copy before editing.

    Built once per test session: xdist workers share their base temp folders' parent (this session's own), and the
    first to take the lock builds while the others wait (the same seed would write the same files twice).
    """
    basetemp = tmp_path_factory.getbasetemp()
    shared = basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp
    root = shared / "tiny-models"
    with FileLock(str(shared / "tiny-models.lock")):
        if not (root / ".built").exists():
            shutil.rmtree(root, ignore_errors=True)
            build_tiny_models(root, seed=0)
            (root / ".built").touch()
    return root


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """No test may reach a hub: both downloaders raise unless a test replaces them with its own fake, and the hubs
    count as reachable without a connection being tried, so that the fakes decide what a download does."""

    def refuse(model_id, local_dir, allow_patterns):
        raise AssertionError(f"unexpected download of {model_id} {allow_patterns} into {local_dir}")

    monkeypatch.setattr(resolve, "download_from_modelscope", refuse)
    monkeypatch.setattr(resolve, "download_from_huggingface", refuse)
    monkeypatch.setattr(resolve, "unreachable_reason", lambda url: None)
    for name in (resolve.SKIP_DOWNLOAD_ENV, resolve.DOWNLOAD_SOURCE_ENV, "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)


def reset_accelerate_state() -> None:
    """Forgets accelerate's process-wide state, so the next in-process run builds its Accelerator afresh."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module's tests: tiny models gain nothing from more, and on a busy 2-core machine
    their spinning threads made them 10x slower. Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def fresh_accelerate_state():
    """Resets accelerate after a test that ran the trainer in-process, as a separate launch would start clean."""
    yield
    reset_accelerate_state()


@pytest.fixture
def base(tiny_root, monkeypatch) -> Path:
    """Points DIFFSYNTH_MODEL_BASE_PATH at the shared tiny repos."""
    monkeypatch.setenv(resolve.BASE_PATH_ENV, str(tiny_root))
    return tiny_root


def load_lora_into_diffusers(pipe, path, adapter_name: str) -> list[str]:
    """``pipe.load_lora_weights`` with every warning diffusers and peft emit (logged or warned) collected."""
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    loggers = [logging.getLogger(name) for name in ("diffusers", "peft")]
    for each in loggers:
        each.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pipe.load_lora_weights(str(path), adapter_name=adapter_name)
    finally:
        for each in loggers:
            each.removeHandler(handler)
    return [record.getMessage() for record in records] + [str(warning.message) for warning in caught]


@pytest.fixture
def scratch_base(tiny_root, tmp_path, monkeypatch):
    """A private base folder; ``copy(model_id, component)`` copies one component of a tiny repo into it to edit."""
    monkeypatch.setenv(resolve.BASE_PATH_ENV, str(tmp_path))

    def copy(model_id: str, component: str) -> Path:
        target = tmp_path / model_id / component
        shutil.copytree(tiny_root / model_id / component, target)
        return target

    copy.root = tmp_path
    return copy


def load_script(relative_path: str, module_name: str, register: bool = False) -> types.ModuleType:
    """Imports the script at ``relative_path`` (from the repository root) as module ``module_name``, without running
    its main; ``register`` enters it in ``sys.modules`` first, for a script whose dataclasses look their module up."""
    spec = importlib.util.spec_from_file_location(module_name, REPO / relative_path)
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def python_output(code: str) -> str:
    """What ``python -c code``, a fresh interpreter in the repository root, prints (stripped); it must succeed."""
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()
