"""Suite-wide fixtures: GPU tests skipped without CUDA, the tiny model repos, and no network access."""

import logging
import warnings
from pathlib import Path

import pytest
import torch

from diffsynth.core.loader import resolve
from diffsynth.core.loader.tiny_models import build_tiny_models


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    """A model base folder holding the tiny Qwen-Image and Wan repos. Read-only: copy before editing."""
    root = tmp_path_factory.mktemp("models")
    build_tiny_models(root, seed=0)
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
