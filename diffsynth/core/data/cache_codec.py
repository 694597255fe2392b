"""Turns a pipeline state into named tensors plus a JSON structure, and back, exactly.

Safetensors stores only a flat map of named tensors and a map of string metadata. A pipeline state is three dicts
(``shared``, ``posi``, ``nega``) of arbitrarily nested dicts, lists and tuples holding tensors, PIL images and plain
values. The encoder stores each tensor under the path that leads to it (``shared/latents``, ``posi/embeds/0``) and
describes everything else in a JSON tree whose every node carries a type tag, because plain JSON would turn tuples
into lists and cannot say whether ``1`` was an int or a bool. PIL images are stored as their raw bytes in a uint8
tensor, rebuilt with their mode and size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from PIL import Image

from .errors import CacheError

STATE_KEYS = ("shared", "posi", "nega")

# Palette images would need their palette too; the pipelines convert images to RGB before any unit sees them.
_UNSUPPORTED_IMAGE_MODES = ("P", "PA")


def _escape(key: str) -> str:
    """Keeps tensor names unambiguous when a dict key itself contains the ``/`` that joins path parts."""
    return key.replace("%", "%25").replace("/", "%2F")


class _Encoder:
    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self._name_of: dict[int, str] = {}
        self._storages: set[int] = set()

    def encode(self, value: Any, path: tuple[str, ...]) -> dict[str, Any]:
        # bool before int: bool is a subclass of int and would come back as 0 / 1.
        if value is None:
            return {"t": "none"}
        if isinstance(value, bool):
            return {"t": "bool", "v": value}
        if isinstance(value, int):
            return {"t": "int", "v": value}
        if isinstance(value, float):
            return {"t": "float", "v": value}
        if isinstance(value, str):
            return {"t": "str", "v": value}
        if isinstance(value, torch.Tensor):
            return {"t": "tensor", "name": self._add_tensor(value, path)}
        if isinstance(value, Image.Image):
            return self._encode_image(value, path)
        if isinstance(value, (list, tuple)):
            items = [self.encode(item, (*path, str(index))) for index, item in enumerate(value)]
            return {"t": "tuple" if isinstance(value, tuple) else "list", "items": items}
        if isinstance(value, dict):
            # Optimizer states key their per-parameter entries by int; other keys must be strings.
            kind = "intdict" if value and all(type(key) is int for key in value) else "dict"
            for key in value:
                if kind == "dict" and not isinstance(key, str):
                    raise CacheError(f"{_where(path)} has key {key!r} of type {type(key).__name__}; the cache stores "
                                     "only string or int keys: convert the key in the unit that makes it")
            return {"t": kind, "items": [[key, self.encode(item, (*path, str(key)))] for key, item in value.items()]}
        raise CacheError(
            f"{_where(path)} is a {type(value).__name__}, which the cache cannot store (tensors, PIL images, str, int, "
            "float, bool, None and dicts / lists / tuples of them only); convert it in the unit that makes it, or "
            "drop the key before caching"
        )

    def _add_tensor(self, tensor: torch.Tensor, path: tuple[str, ...]) -> str:
        # A tensor held in two places is stored once and comes back as one object, as it was.
        if id(tensor) in self._name_of:
            return self._name_of[id(tensor)]
        if tensor.layout != torch.strided:
            raise CacheError(f"{_where(path)} is a {tensor.layout} tensor; convert it with .to_dense() before caching")
        name = "/".join(_escape(part) for part in path)
        stored = tensor.detach().cpu()
        storage = stored.untyped_storage().data_ptr()
        # safetensors refuses tensors whose memory overlaps (views of one buffer); copy all but the first.
        if storage in self._storages:
            stored = stored.clone()
        self._storages.add(stored.untyped_storage().data_ptr())
        self.tensors[name] = stored
        self._name_of[id(tensor)] = name
        return name

    def _encode_image(self, image: Image.Image, path: tuple[str, ...]) -> dict[str, Any]:
        if image.mode in _UNSUPPORTED_IMAGE_MODES:
            raise CacheError(f"{_where(path)} is a palette image (mode {image.mode}); convert it with "
                             ".convert('RGB') or .convert('RGBA') before caching")
        raw = np.frombuffer(image.tobytes(), dtype=np.uint8).copy()
        bands = len(image.getbands())
        # Byte-per-band modes get a readable (height, width, bands) shape; packed modes such as "1" stay flat.
        if raw.size == image.width * image.height * bands:
            raw = raw.reshape(image.height, image.width, bands)
        name = "/".join(_escape(part) for part in path)
        self.tensors[name] = torch.from_numpy(raw)
        return {"t": "image", "name": name, "mode": image.mode, "size": list(image.size)}


def _where(path: tuple[str, ...]) -> str:
    return "state entry " + "/".join(path) if path else "the state"


def encode_state(state: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Splits a pipeline state into CPU tensors by name and a JSON-ready structure.

    Args:
        state: ``{"shared": {...}, "posi": {...}, "nega": {...}}``.

    Returns:
        The tensors (images as uint8 tensors) and the tagged structure that ``decode_state`` rebuilds them from.

    Raises:
        CacheError: The state is not those three dicts, or holds a value the cache cannot store (the message names
            its path).
    """
    if not isinstance(state, Mapping) or set(state) != set(STATE_KEYS):
        found = sorted(state) if isinstance(state, Mapping) else type(state).__name__
        raise CacheError(f"a cached sample must be a dict with exactly the keys {list(STATE_KEYS)}, got {found}")
    encoder = _Encoder()
    structure = {}
    for key in STATE_KEYS:
        if not isinstance(state[key], dict):
            raise CacheError(f"state[{key!r}] is a {type(state[key]).__name__}; it must be a dict of inputs")
        structure[key] = encoder.encode(state[key], (key,))
    return encoder.tensors, structure


def encode_tree(value: Any, root: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``encode_state`` for any one value (an optimizer state, say); tensor names start with ``root``."""
    encoder = _Encoder()
    structure = encoder.encode(value, (root,))
    return encoder.tensors, structure


def decode_tree(tensors: Mapping[str, torch.Tensor], structure: Mapping[str, Any]) -> Any:
    """Rebuilds what ``encode_tree`` split."""
    return _decode(structure, tensors)


def decode_state(tensors: Mapping[str, torch.Tensor], structure: Mapping[str, Any]) -> dict[str, Any]:
    """Rebuilds the state ``encode_state`` split: same types, tuples, dtypes, shapes and values.

    Raises:
        KeyError, ValueError, TypeError: The structure does not match the tensors (a corrupt or foreign file).
    """
    return {key: _decode(structure[key], tensors) for key in STATE_KEYS}


def _decode(node: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> Any:
    kind = node["t"]
    if kind == "none":
        return None
    if kind in ("bool", "int", "float", "str"):
        value = node["v"]
        expected = {"bool": bool, "int": int, "float": float, "str": str}[kind]
        if type(value) is not expected:
            raise TypeError(f"a {kind} node holds {value!r}")
        return value
    if kind == "tensor":
        return tensors[node["name"]]
    if kind == "image":
        width, height = node["size"]
        return Image.frombytes(node["mode"], (width, height), tensors[node["name"]].numpy().tobytes())
    if kind in ("list", "tuple"):
        items = [_decode(item, tensors) for item in node["items"]]
        return tuple(items) if kind == "tuple" else items
    if kind in ("dict", "intdict"):
        if kind == "intdict" and not all(type(key) is int for key, _ in node["items"]):
            raise TypeError("an intdict node holds a key that is not an int")
        return {key: _decode(item, tensors) for key, item in node["items"]}
    raise ValueError(f"unknown node type {kind!r}")
