"""Whether a model hub can be reached from here, answered within seconds, before a download starts.

Without a network, ModelScope's client retries each listing with growing pauses (about 22 s per model, measured with
modelscope 1.40) and then fails with a chain of seven exceptions; an offline run with three missing models used to
stop only after that. One TCP connection to the hub (or to the proxy the clients would use) tells the same in
milliseconds when the name does not resolve or the connection is refused, and within :data:`TIMEOUT_SECONDS` when
packets are dropped. It proves nothing about the files: a reachable hub can still refuse a repository, and then the
client's own error is reported.

The address is the one the download clients read: ``MODELSCOPE_ENDPOINT`` (or the older ``MODELSCOPE_DOMAIN``) for
ModelScope, ``HF_ENDPOINT`` for the Hugging Face Hub, and the usual ``https_proxy`` / ``all_proxy`` / ``no_proxy``
variables. ``HF_HUB_OFFLINE=1`` (or ``TRANSFORMERS_OFFLINE=1``) means the Hugging Face Hub is not to be asked at all.
"""

from __future__ import annotations

import os
import socket
import threading
import urllib.request
from urllib.parse import urlsplit

TIMEOUT_SECONDS = 5.0
HUB_ENDPOINTS = {"modelscope": "https://modelscope.cn", "huggingface": "https://huggingface.co"}
_TRUE = ("1", "true", "yes", "on")


def hub_endpoint(source: str) -> str:
    """The URL the ``source`` client downloads from, after the environment variables the client itself reads."""
    if source == "huggingface":
        return os.environ.get("HF_ENDPOINT") or HUB_ENDPOINTS["huggingface"]
    endpoint = os.environ.get("MODELSCOPE_ENDPOINT") or os.environ.get("MODELSCOPE_DOMAIN") or HUB_ENDPOINTS[source]
    return endpoint if "://" in endpoint else f"https://{endpoint}"


def offline_by_environment(source: str) -> str | None:
    """The variable that tells the ``source`` client not to use the network, or None."""
    if source != "huggingface":
        return None
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(name, "").strip().lower() in _TRUE:
            return f"{name}={os.environ[name]}"
    return None


def connection_target(url: str) -> tuple[str, int, str]:
    """``(host, port, what)``: where a client connects to fetch ``url``, the proxy it would use or the host itself."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if proxy and not urllib.request.proxy_bypass(host):
        proxy_parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        return proxy_parts.hostname or "", proxy_parts.port or 8080, f"the proxy {proxy_parts.netloc} for {host}"
    return host, port, f"{host}:{port}"


def unreachable_reason(url: str, timeout: float = TIMEOUT_SECONDS) -> str | None:
    """Why no TCP connection to ``url``'s host (or its proxy) can be opened, or None when one can.

    The name lookup and the connection run in a daemon thread, since a lookup with no DNS server in reach can block
    far longer than ``timeout`` and cannot be given one itself.
    """
    host, port, what = connection_target(url)
    outcome: list[str | None] = []

    def attempt() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                outcome.append(None)
        except socket.gaierror as error:
            outcome.append(f"the name {host} does not resolve ({error.strerror or error})")
        except TimeoutError:
            outcome.append(f"no answer from {what} within {timeout:g} s")
        except OSError as error:
            outcome.append(f"cannot connect to {what} ({error.strerror or error})")

    thread = threading.Thread(target=attempt, name="hub-reachability", daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    return outcome[0] if outcome else f"no answer from {what} within {timeout:g} s (name lookup still pending)"
