"""Small files (and file headers) read once per run while unchanged, and each checkpoint opened once per load.

Before training starts, several phases ask about the same files: the trainer's model checks, the pipeline's companion
folders, the LoRA target check on the skeleton and the load itself each need the class a folder's ``config.json``
names, the shards its ``*.safetensors.index.json`` lists and the tensor names and shapes in each checkpoint's header
(a ``.pth`` file's header is its whole pickle); the dataset's start-up check reads every image's header, and bucketed
batching needs its size again. ``parsed`` reads and parses each such file once and hands the result out again while
the file is unchanged; ``read_json`` is that for JSON files. Every caller gets its own deep copy, since some consumers
change what they are given (transformers' ``from_dict`` pops keys).

A file counts as unchanged while its size, modification and change times, inode and device are those it had when it
was parsed, so a file replaced or rewritten between two reads is read again. File times are coarse (a few
milliseconds on Linux), so a rewrite to the same size within that window could look unchanged: as git does for its
index, a file modified less than ``RECENT_SECONDS`` before it was read is not remembered.

``one_load`` scopes one model load: a checkpoint opened during it (for its header, or for its tensors) stays open
until the load ends, so the header read and the tensor reads share one opening; for a ``.pth`` file that is one
unpickling per load instead of two. Outside a load every opening is the caller's own.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
H = TypeVar("H")

RECENT_SECONDS = 2.0
"""A file modified this recently when it is read is parsed again on every read (its time cannot vouch for it)."""
MAX_ENTRIES = 512
"""Files of one kind remembered at once by default (least recently used dropped first): more than the configs,
indexes and shards of the models of one run, each entry a few kilobytes of names and shapes."""

_lock = threading.Lock()
# kind -> absolute path -> (the file's stamp when parsed, what was parsed)
_memos: dict[str, OrderedDict[str, tuple[tuple[int, ...], Any]]] = {}


class _Load:
    """The checkpoints one load has opened, by absolute path, and the stack that closes them when it ends."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self.stack = stack
        self.handles: dict[str, Any] = {}


_current_load: contextvars.ContextVar[_Load | None] = contextvars.ContextVar("current_load", default=None)


def _stamp(path: Path) -> tuple[int, ...]:
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino, stat.st_dev


def parsed(path: Path, kind: str, parse: Callable[[Path], T], limit: int = MAX_ENTRIES) -> T:
    """``parse(path)``, computed once while the file is unchanged (see the module docstring).

    Args:
        path: The file.
        kind: What ``parse`` makes of it (two parsers of one file are remembered apart).
        parse: Reads and parses the file; what it raises reaches the caller and nothing is remembered.
        limit: Files of this kind remembered at once.

    Returns:
        A deep copy of what ``parse`` returned, the caller's to change.

    Raises:
        OSError: The file cannot be looked at (``FileNotFoundError`` when it is missing).
    """
    key = os.path.abspath(path)
    stamp = _stamp(path)
    with _lock:
        memo = _memos.setdefault(kind, OrderedDict())
        found = memo.get(key)
        if found is not None and found[0] == stamp:
            memo.move_to_end(key)
            return copy.deepcopy(found[1])
    value = parse(path)
    if time.time_ns() - stamp[1] >= RECENT_SECONDS * 1e9 and _stamp(path) == stamp:
        with _lock:
            memo[key] = (stamp, copy.deepcopy(value))
            memo.move_to_end(key)
            while len(memo) > limit:
                memo.popitem(last=False)
    return value


def read_json(path: Path) -> Any:
    """``json.loads(path.read_text())``, read once while the file is unchanged; raises as that would."""
    return parsed(path, "json", lambda file: json.loads(file.read_text()))


def forget() -> None:
    """Drops everything remembered (for tests that count reads from a clean start)."""
    with _lock:
        _memos.clear()


@contextlib.contextmanager
def one_load() -> Iterator[None]:
    """Scopes one model load: checkpoints opened inside (through ``open_once``) stay open until it ends.

    Nested scopes join the outer one.
    """
    if _current_load.get() is not None:
        yield
        return
    with contextlib.ExitStack() as stack:
        token = _current_load.set(_Load(stack))
        try:
            yield
        finally:
            _current_load.reset(token)


@contextlib.contextmanager
def open_once(file: Path, opener: Callable[[Path], AbstractContextManager[H]]) -> Iterator[H]:
    """Opens ``file`` with ``opener`` (a context manager factory such as ``safe_open``), or, inside ``one_load``,
    hands out the handle the load already opened; the load then closes it when it ends."""
    load = _current_load.get()
    if load is None:
        with opener(file) as handle:
            yield handle
        return
    key = os.path.abspath(file)
    if key not in load.handles:
        load.handles[key] = load.stack.enter_context(opener(file))
    yield load.handles[key]
