"""The family test kit's fixtures, parametrized over the registered families (``test_family_kit*.py``)."""

import pytest

from diffsynth.pipelines.registry import FamilySpec, families
from diffsynth.testing.families import tiny_family

FAMILIES = families()


@pytest.fixture(scope="module", params=FAMILIES, ids=[spec.name for spec in FAMILIES])
def spec(request) -> FamilySpec:
    return request.param


@pytest.fixture(scope="module")
def tiny(spec):
    return tiny_family(spec.name)
