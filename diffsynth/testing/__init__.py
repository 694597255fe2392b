"""Tiny random-weight instances of the real model classes, saved in the released repositories' layouts: what the
tests, the demo and the docs' examples build (``python -m diffsynth.testing.tiny_models --output ./models``)."""
