"""Fixtures shared by the trainer tests."""

import pytest
from safetensors.torch import load_file

from tests.conftest import reset_accelerate_state

from diffsynth.core.data.example_dataset import build_example_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A three-image example dataset (``metadata.csv`` with image and prompt columns), one per test module."""
    folder = tmp_path_factory.mktemp("dataset")
    build_example_dataset(folder, num_images=3)
    return folder


def lora(output, name="epoch-1"):
    """The tensors of LoRA file ``<output>/<name>.safetensors``."""
    return load_file(str(output / f"{name}.safetensors"))


def max_difference(first, second):
    """The largest absolute difference between two state dicts with the same keys."""
    assert first.keys() == second.keys()
    return max((first[key] - second[key]).abs().max().item() for key in first)


def run_once(tiny_root, folder, train):
    """A module's reference run: ``train(output)`` in this process on the tiny repos, accelerate's state reset after;
    returns ``(output, result)``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        output = folder / "out"
        result = train(output)
    reset_accelerate_state()
    return output, result
