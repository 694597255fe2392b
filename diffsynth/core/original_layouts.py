"""The readers of original (non-diffusers) release layouts that loading asks, registered by the model families.

``core`` never names a family: a family's ``FamilySpec`` names its reader as ``"module:function"``, the pipelines'
registry registers it here when ``diffsynth.pipelines`` is imported, and loading imports each reader on first use.
A reader is ``identify(files: list[Path]) -> OriginalModel | None`` (``core.loader.original_layout``): None for files
that are not its layout.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

_READERS: list[str] = []


def register_original_layout(reader: str) -> None:
    """Adds ``reader`` (``"package.module:function"``) to the readers loading asks, once; earlier ones are asked
    first."""
    module, sep, function = reader.partition(":")
    if not sep or not module or not function.isidentifier():
        raise ValueError(f"reader={reader!r} must be 'package.module:function'")
    if reader not in _READERS:
        _READERS.append(reader)


def original_layout_readers() -> list[Callable[[Any], Any]]:
    """The registered readers, imported, in registration order."""
    readers = []
    for reader in _READERS:
        module, _, function = reader.partition(":")
        readers.append(getattr(importlib.import_module(module), function))
    return readers


def identify_original(files: Any) -> Any:
    """What the first reader that knows ``files`` makes of them (an ``OriginalModel``), or None for the diffusers and
    transformers layouts (and a tokenizer)."""
    for read in original_layout_readers():
        found = read(files)
        if found is not None:
            return found
    return None
