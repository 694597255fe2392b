"""What loading and fp8 storage must know of particular model classes, registered by the model families.

``core`` never names a family. Each family's ``FamilySpec`` (``diffsynth/pipelines/<family>/spec.py``) declares these
traits as data, and the pipelines' registry registers them here when ``diffsynth.pipelines`` is imported (this module
imports nothing, so registering costs nothing):

- original-layout readers, ``"module:function"`` names of ``identify(files) -> OriginalModel | None``
  (``core.loader.original_layout``), asked in turn by loading and imported on first use;
- layers whose forward casts its input to the layer's weight dtype without listing them in the class's
  ``_keep_in_fp32_modules``, which fp8 storage must leave alone;
- modules of diffusers or transformers, besides the library's top level, that hold model classes a release's
  ``config.json`` names (diffusers keeps some models in their pipeline's package), or a room's own subclasses of
  them, registered by the room whose releases name them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any

_READERS: list[str] = []
_INPUT_CASTING_LAYERS: dict[str, tuple[str, ...]] = {}
_MODEL_MODULES: list[tuple[str, str]] = []


def register_original_layout(reader: str) -> None:
    """Adds ``reader`` (``"package.module:function"``) to the readers loading asks, once; earlier ones are asked
    first.

    Raises:
        ValueError: ``reader`` is not of that form.
    """
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


def register_input_casting_layers(class_name: str, layers: Iterable[str]) -> None:
    """Records the layers of ``class_name`` whose forward casts its input to their weight dtype."""
    _INPUT_CASTING_LAYERS[class_name] = tuple(dict.fromkeys((*_INPUT_CASTING_LAYERS.get(class_name, ()), *layers)))


def input_casting_layers(class_name: str) -> tuple[str, ...]:
    """The layers registered for ``class_name`` with ``register_input_casting_layers`` (none by default)."""
    return _INPUT_CASTING_LAYERS.get(class_name, ())


def register_model_module(module: str, library: str | None = None) -> None:
    """Records ``module`` as holding model classes that loading looks up by name when the library's top level lacks
    them: a submodule of diffusers or transformers (e.g. ``"diffusers.pipelines.<name>"``, whose library is the
    first part of the name), or a room's own module of subclasses of a library's models, with ``library`` named.

    Raises:
        ValueError: ``module`` is not a submodule of diffusers or transformers and ``library`` is not one of them.
    """
    first, dot, rest = module.partition(".")
    library = library or first
    if library not in ("diffusers", "transformers") or not dot or not rest:
        raise ValueError(f"module={module!r} must be a submodule of diffusers or transformers, e.g. "
                         "'diffusers.pipelines.<name>', or a module of their subclasses with library='diffusers' "
                         "or 'transformers'")
    if (module, library) not in _MODEL_MODULES:
        _MODEL_MODULES.append((module, library))


def model_modules(library: str) -> list[str]:
    """The modules of ``library`` registered with ``register_model_module``, in registration order."""
    return [module for module, owner in _MODEL_MODULES if owner == library]
