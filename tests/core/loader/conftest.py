"""Fixtures: the tiny repos (built once per session) and a guard that makes any real download fail loudly."""

import shutil
from pathlib import Path

import pytest

from diffsynth.core.loader import resolve
from diffsynth.core.loader.tiny_models import QWEN_IMAGE_MODEL_ID, WAN_MODEL_ID, build_tiny_models


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    """A model base folder holding the tiny Qwen-Image and Wan repos. Read-only: copy before editing."""
    root = tmp_path_factory.mktemp("models")
    build_tiny_models(root, seed=0)
    return root


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """No test may reach a hub: both downloaders raise unless a test replaces them with its own fake."""

    def refuse(model_id, local_dir, allow_patterns):
        raise AssertionError(f"unexpected download of {model_id} {allow_patterns} into {local_dir}")

    monkeypatch.setattr(resolve, "download_from_modelscope", refuse)
    monkeypatch.setattr(resolve, "download_from_huggingface", refuse)
    for name in (resolve.SKIP_DOWNLOAD_ENV, resolve.DOWNLOAD_SOURCE_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def base(tiny_root, monkeypatch) -> Path:
    """Points DIFFSYNTH_MODEL_BASE_PATH at the shared tiny repos."""
    monkeypatch.setenv(resolve.BASE_PATH_ENV, str(tiny_root))
    return tiny_root


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


QWEN = QWEN_IMAGE_MODEL_ID
WAN = WAN_MODEL_ID
