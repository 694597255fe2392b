"""The hub check before a download: local sockets only (a listening one, a closed port), never a real hub."""

import socket
import threading

import pytest

from diffsynth.core.loader import reachability
from diffsynth.core.loader.reachability import (connection_target, hub_endpoint, offline_by_environment,
                                                unreachable_reason)


def closed_port() -> int:
    """A local port nobody listens on: bound, then released."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(autouse=True)
def no_proxies(monkeypatch):
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
                 "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)


def test_a_listening_host_is_reachable_and_a_closed_port_is_not():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert unreachable_reason(f"http://127.0.0.1:{server.getsockname()[1]}") is None
    port = closed_port()
    assert unreachable_reason(f"http://127.0.0.1:{port}") == f"cannot connect to 127.0.0.1:{port} (Connection refused)"


def test_a_lookup_that_hangs_is_given_up_after_the_timeout(monkeypatch):
    # As with no DNS server in reach: the system's lookup blocks, longer than any connection timeout. Nothing is
    # timed: the answer must come while the lookup still hangs, and the join waits the timeout and no more.
    release, attempts, joins = threading.Event(), [], []

    def hang(address, timeout):
        attempts.append((address, timeout))
        release.wait(30)
        raise socket.gaierror("released by the test")  # the abandoned thread ends quietly, not in a later test

    original_join = threading.Thread.join

    def join(self, timeout=None):
        joins.append(timeout)
        return original_join(self, timeout)

    monkeypatch.setattr(socket, "create_connection", hang)
    monkeypatch.setattr(threading.Thread, "join", join)
    try:
        reason = unreachable_reason("https://modelscope.cn", timeout=0.2)
        still_hanging = not release.is_set()
    finally:
        release.set()
    assert still_hanging and attempts == [(("modelscope.cn", 443), 0.2)] and joins == [0.2 + 0.5]
    assert reason == "no answer from modelscope.cn:443 within 0.2 s (name lookup still pending)"


def test_the_clients_proxy_is_what_is_checked(monkeypatch):
    monkeypatch.setenv("https_proxy", "http://proxy.example:3128")
    assert connection_target("https://modelscope.cn") == ("proxy.example", 3128,
                                                          "the proxy proxy.example:3128 for modelscope.cn")
    monkeypatch.setenv("no_proxy", "modelscope.cn")
    assert connection_target("https://modelscope.cn") == ("modelscope.cn", 443, "modelscope.cn:443")
    port = closed_port()
    monkeypatch.setenv("https_proxy", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("no_proxy")
    assert unreachable_reason("https://huggingface.co") == (f"cannot connect to the proxy 127.0.0.1:{port} for "
                                                            "huggingface.co (Connection refused)")


def test_endpoints_follow_the_clients_variables(monkeypatch):
    for name in ("HF_ENDPOINT", "MODELSCOPE_ENDPOINT", "MODELSCOPE_DOMAIN"):
        monkeypatch.delenv(name, raising=False)
    assert hub_endpoint("modelscope") == "https://modelscope.cn"
    assert hub_endpoint("huggingface") == "https://huggingface.co"
    monkeypatch.setenv("MODELSCOPE_DOMAIN", "www.modelscope.ai")
    assert hub_endpoint("modelscope") == "https://www.modelscope.ai"
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", "http://mirror.local:8000")
    monkeypatch.setenv("HF_ENDPOINT", "https://hf-mirror.com")
    assert (hub_endpoint("modelscope"), hub_endpoint("huggingface")) == ("http://mirror.local:8000",
                                                                         "https://hf-mirror.com")


def test_the_hugging_face_offline_switches(monkeypatch):
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    assert offline_by_environment("huggingface") is None
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    assert offline_by_environment("huggingface") == "TRANSFORMERS_OFFLINE=1"
    monkeypatch.setenv("HF_HUB_OFFLINE", "true")
    assert offline_by_environment("huggingface") == "HF_HUB_OFFLINE=true"
    assert offline_by_environment("modelscope") is None
    assert reachability.TIMEOUT_SECONDS <= 5  # an offline run must fail within seconds
