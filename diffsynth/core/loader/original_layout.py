"""What an original (non-diffusers) release layout loads as: the class to build, its config, where each tensor is.

A family whose releases ship another layout (Wan's ``WanModel`` folders and ``.pth`` encoders, FLUX.1's single files)
writes a reader ``identify(files) -> OriginalModel | None`` in its own room and names it in its ``FamilySpec``; the
pipelines' registry registers it with ``core.original_layouts``, and loading asks each reader in turn.

A release may hold several models in one file (a whole pipeline's weights): the file loads as its first model, and
``OriginalModel.others`` describes the rest, which ``loading.load_components`` loads too.

Some releases cut one model in files that load alone (a VAE as an encoder file for training and a decoder file for
inference). Such a file loads as the whole class with the other part left out (``OriginalModel.absent``): the part is
an ``AbsentPart``, which holds no weight and names the missing file when called; ``join_parts`` puts two such halves
together when a pipeline is given both files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .errors import ModelLoadError
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
        absent: Submodules the files do not hold (``"decoder"`` of an encoder-only VAE) -> ``(message, config
            keys)``: loading puts an ``AbsentPart`` there, which raises the message when called; the config keys are
            those describing the part, taken from the other half's model by ``join_parts``.
        others: Further models the same file holds (a release in one file): loading the file gives this model,
            ``loading.load_components`` each of them too.
        packed: The model keys of Linear weights stored in bitsandbytes' 4-bit layout (``nf4_layout``): loading
            makes their layers ``Linear4bit`` and assigns the packed weights.
    """

    kind: str
    library: str
    class_name: str
    config: dict[str, Any]
    entries: dict[str, CheckpointEntry] = field(repr=False)
    source: Path
    absent: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    others: tuple[OriginalModel, ...] = ()
    packed: frozenset[str] = frozenset()


class AbsentPart(torch.nn.Module):
    """The place of a submodule whose weights were not loaded (the other file of a model cut in two).

    It holds no tensor; calling it raises ``ModelLoadError`` with ``message``, which names the file to add.
    """

    def __init__(self, message: str, config_keys: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.message = message
        self.config_keys = config_keys

    def forward(self, *args: Any, **kwargs: Any) -> None:
        raise ModelLoadError(self.message)

    def extra_repr(self) -> str:
        return "absent"


def absent_parts(model: torch.nn.Module) -> dict[str, AbsentPart]:
    """The direct submodules of ``model`` that are ``AbsentPart`` placeholders, by name."""
    return {name: child for name, child in model.named_children() if isinstance(child, AbsentPart)}


def leave_out(model: torch.nn.Module, absent: dict[str, tuple[str, tuple[str, ...]]]) -> None:
    """Replaces each named direct submodule of ``model`` by an ``AbsentPart`` (before its weights are planned)."""
    for name, (message, config_keys) in absent.items():
        setattr(model, name, AbsentPart(message, config_keys))


def join_parts(first: torch.nn.Module, second: torch.nn.Module) -> bool:
    """Moves into ``first`` the parts ``second`` holds and ``first`` lacks (an encoder-only and a decoder-only VAE
    become one), with the config entries describing them; True when joined.

    Returns False, changing nothing, unless both are partial models of one class whose missing parts differ, so
    that a genuine second model is still reported by the caller.

    Raises:
        ModelLoadError: The halves disagree on a setting or a tensor both hold (halves of two different models).
    """
    missing, other_missing = absent_parts(first), absent_parts(second)
    if type(first) is not type(second) or not missing or not other_missing or not missing.keys().isdisjoint(
            other_missing):
        return False
    config, other = dict(getattr(first, "config", {})), dict(getattr(second, "config", {}))
    owned = {key for part in (*missing.values(), *other_missing.values()) for key in part.config_keys}
    clash = [f"{key}: {config[key]!r} vs {other[key]!r}" for key in sorted(config) if not key.startswith("_")
             and key not in owned and key in other and config[key] != other[key]]
    shared = dict(first.named_buffers(recurse=False)) | dict(first.named_parameters(recurse=False))
    theirs = dict(second.named_buffers(recurse=False)) | dict(second.named_parameters(recurse=False))
    clash += [f"{name} differs" for name, tensor in shared.items()
              if name in theirs and not torch.equal(tensor.cpu(), theirs[name].to("cpu", tensor.dtype))]
    if clash:
        raise ModelLoadError(f"the two files of one {type(first).__name__} describe different models ({clash[0]}); "
                             "give both halves of the same release")
    for name, part in missing.items():
        setattr(first, name, getattr(second, name))
        if part.config_keys and hasattr(first, "register_to_config"):
            first.register_to_config(**{key: other[key] for key in part.config_keys if key in other})
    return True


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
