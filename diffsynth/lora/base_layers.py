"""The base model as reading and checking a LoRA needs it: its class name and every LoRA-able layer's weight shape.

The trainer records this table in each LoRA file's metadata (``diffsynth.lora.base_model_layers``), so that
``python -m diffsynth.lora inspect`` checks a file without importing diffusers or building the model: on this
machine that import alone is several seconds, the rest of an inspection a fraction of one. The table is written as
name patterns rather than names, readable in a metadata viewer and small: a model of 60 alike blocks repeats one
pattern per layer of a block, with the block indices as ranges, e.g.
``["transformer_blocks.#.attn.to_q", [3072, 3072], [["0-59"]]]``.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from .naming import lora_layers

LAYERS_KEY = "diffsynth.lora.base_model_layers"
_NUMBER = re.compile(r"^\d+$")


@dataclass(frozen=True)
class BaseLayers:
    """A base model's class name and the weight shape of each layer a LoRA can wrap, under diffusers names.

    Attributes:
        model_class: The model's class name, e.g. ``QwenImageTransformer2DModel``.
        shapes: Layer name (peft wrappers seen through) -> weight shape, in the model's module order.
    """

    model_class: str
    shapes: Mapping[str, tuple[int, ...]]

    @classmethod
    def of(cls, model: torch.nn.Module) -> BaseLayers:
        """The table of ``model`` (its weights may be on the meta device, and a LoRA may be injected)."""
        return cls(type(model).__name__, {name: _weight_shape(layer) for name, layer in lora_layers(model)})

    def to_metadata(self) -> str:
        """The shapes as the compact JSON the metadata entry ``LAYERS_KEY`` holds (see the module docstring)."""
        groups: dict[tuple[str, tuple[int, ...]], list[tuple[int, ...]]] = defaultdict(list)
        for name, shape in self.shapes.items():
            parts = name.split(".")
            pattern = ".".join("#" if _NUMBER.match(part) else part for part in parts)
            groups[pattern, tuple(shape)].append(tuple(int(part) for part in parts if _NUMBER.match(part)))
        return json.dumps([[pattern, list(shape), _packed(indices)] for (pattern, shape), indices in groups.items()],
                          separators=(",", ":"))

    @classmethod
    def from_metadata(cls, model_class: str, text: str) -> BaseLayers:
        """The table written by :meth:`to_metadata`.

        Raises:
            ValueError: ``text`` is no such table.
        """
        try:
            shapes = {}
            for pattern, shape, packed in json.loads(text):
                for indices in _unpacked(packed):
                    numbers = iter(indices)
                    name = ".".join(str(next(numbers)) if part == "#" else part for part in pattern.split("."))
                    shapes[name] = tuple(int(size) for size in shape)
        except (ValueError, TypeError, StopIteration) as error:
            raise ValueError(f"the metadata entry {LAYERS_KEY} is not a layer table ({error})") from error
        return cls(model_class, shapes)


def _weight_shape(layer: torch.nn.Module) -> tuple[int, ...]:
    """The shape of ``layer``'s weight as declared, whatever its storage (NF4 packs it, fp8 keeps it)."""
    if isinstance(layer, torch.nn.Linear):
        return layer.out_features, layer.in_features
    return layer.out_channels, layer.in_channels // layer.groups, *layer.kernel_size


def _packed(indices: Iterable[tuple[int, ...]]) -> list[list]:
    """Index tuples as ``[first indices as ranges "a-b,c", *the other indices]``, one entry per other indices."""
    by_rest: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for numbers in indices:
        if not numbers:
            return [[]]
        by_rest[numbers[1:]].append(numbers[0])
    packed = []
    for rest, firsts in by_rest.items():
        runs: list[list[int]] = []
        for first in sorted(firsts):
            if runs and first == runs[-1][1] + 1:
                runs[-1][1] = first
            else:
                runs.append([first, first])
        packed.append([",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs), *rest])
    return packed


def _unpacked(packed: list[list]) -> Iterable[tuple[int, ...]]:
    for entry in packed:
        if not entry:
            yield ()
            continue
        ranges, *rest = entry
        for run in ranges.split(","):
            first, _, last = run.partition("-")
            for number in range(int(first), int(last or first) + 1):
                yield (number, *(int(value) for value in rest))
