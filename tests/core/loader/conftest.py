"""Loader fixtures: the ids of the shared tiny repos (tests/conftest.py builds them and gives scratch_base)."""

from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID, WAN_MODEL_ID

QWEN = QWEN_IMAGE_MODEL_ID
WAN = WAN_MODEL_ID
