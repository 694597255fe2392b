"""Fixtures of the example-script tests: a scratch working folder on a model base folder."""

from pathlib import Path

import pytest

from diffsynth.core.loader import resolve


@pytest.fixture
def model_root(tiny_root) -> Path:
    """The model base folder the scripts run on: the tiny repos (a module overrides it to add releases)."""
    return tiny_root


@pytest.fixture
def workdir(model_root, tmp_path, monkeypatch) -> Path:
    """A scratch working folder, the current one, with ``DIFFSYNTH_MODEL_BASE_PATH`` on ``model_root``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(resolve.BASE_PATH_ENV, str(model_root))
    return tmp_path
