"""Loader fixtures: a private base folder to edit; the shared tiny repos live in tests/conftest.py."""

import shutil
from pathlib import Path

import pytest

from diffsynth.core.loader import resolve
from diffsynth.core.loader.tiny_models import QWEN_IMAGE_MODEL_ID, WAN_MODEL_ID


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
