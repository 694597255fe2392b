"""Tests of the example scripts under examples/."""
