"""The process-group timeout setting and what counts as a lost peer (the lost-process line end to end:
tests/training/test_multi_machine.py)."""

from datetime import timedelta

import pytest

from diffsynth.training.config.errors import FlagError
from diffsynth.training.machines import PROCESS_TIMEOUT_ENV, lost_process_line, process_group_timeout
from diffsynth.training.machines.watch import is_communication_error

GLOO_RESET = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:27060: Connection "
              "reset by peer")


def test_the_timeout_is_torchs_default_unless_set(monkeypatch):
    monkeypatch.delenv(PROCESS_TIMEOUT_ENV, raising=False)
    assert process_group_timeout() is None
    monkeypatch.setenv(PROCESS_TIMEOUT_ENV, "90")
    assert process_group_timeout() == timedelta(seconds=90)
    for bad in ("0", "ten", "-5"):
        monkeypatch.setenv(PROCESS_TIMEOUT_ENV, bad)
        with pytest.raises(FlagError, match=f"{PROCESS_TIMEOUT_ENV}={bad} must be a number of seconds above 0"):
            process_group_timeout()


def test_communication_errors_are_told_from_others():
    assert is_communication_error(RuntimeError(GLOO_RESET))
    try:
        try:
            raise RuntimeError(GLOO_RESET)
        except RuntimeError as error:
            raise ValueError("while saving") from error
    except ValueError as chained:
        assert is_communication_error(chained)
    assert not is_communication_error(RuntimeError("CUDA out of memory"))
    # A single process has no watch: its errors keep their tracebacks.
    assert lost_process_line(RuntimeError(GLOO_RESET)) is None
