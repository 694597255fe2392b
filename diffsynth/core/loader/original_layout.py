"""What an original (non-diffusers) release layout loads as: the class to build, its config, where each tensor is.

A family whose releases ship another layout (Wan's ``WanModel`` folders and ``.pth`` encoders, FLUX.1's single files)
writes a reader ``identify(files) -> OriginalModel | None`` in its own room and names it in its ``FamilySpec``; the
pipelines' registry registers it with ``core.original_layouts``, and loading asks each reader in turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .state_dict import CheckpointEntry, read_headers


@dataclass(frozen=True)
class OriginalModel:
    """One original-layout checkpoint, described as the diffusers / transformers model it loads into.

    Attributes:
        kind: ``"dit"``, ``"umt5"``, ``"vae"`` or ``"clip"``.
        library: ``"diffusers"`` or ``"transformers"``.
        class_name: The class to build, e.g. ``"WanTransformer3DModel"``.
        config: The class's config (``from_config`` arguments for diffusers, the config class's for transformers).
        entries: ``{model key: where its tensor is}``, ready for ``plan_keys``.
        source: The file or folder, for messages.
    """

    kind: str
    library: str
    class_name: str
    config: dict[str, Any]
    entries: dict[str, CheckpointEntry] = field(repr=False)
    source: Path


def single_file_entries(files: list[Path]) -> tuple[Path, dict[str, CheckpointEntry]] | None:
    """The one ``.safetensors`` file among ``files`` and its tensors' entries (headers only), or None when there is
    not exactly one: the single-file layouts' readers start here."""
    shards = [path for path in files if path.is_file() and path.name.endswith(".safetensors")]
    if len(shards) != 1:
        return None
    return shards[0], read_headers(shards)


def renamed_entries(entries: dict[str, CheckpointEntry], keys: dict[str, str]) -> dict[str, CheckpointEntry]:
    """Entries under the model's names ``keys`` (model key -> checkpoint key), unconverted."""
    return converted_entries(entries, {model_key: (key, None) for model_key, key in keys.items()})


def converted_entries(entries: dict[str, CheckpointEntry], sources: dict[str, tuple[str, Any]]) -> dict[str, CheckpointEntry]:
    """Entries under the model's names, each with the shape it has after its conversion (worked out on meta)."""
    import torch

    converted = {}
    for model_key, (key, convert) in sources.items():
        entry = entries[key]
        shape = entry.shape
        if convert is not None:
            shape = tuple(convert(torch.empty(entry.shape, device="meta")).shape)
        converted[model_key] = CheckpointEntry(file=entry.file, checkpoint_key=key, shape=shape, convert=convert)
    return converted
