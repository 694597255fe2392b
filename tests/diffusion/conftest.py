"""Fixtures shared by the trainer tests."""

import pytest

from diffsynth.core.data.example_dataset import build_example_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A three-image example dataset (``metadata.csv`` with image and prompt columns), one per test module."""
    folder = tmp_path_factory.mktemp("dataset")
    build_example_dataset(folder, num_images=3)
    return folder
