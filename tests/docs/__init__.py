"""Tests that the user docs agree with the code."""
