"""Fixtures shared by the trainer tests."""

import pytest
from safetensors.torch import load_file

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
