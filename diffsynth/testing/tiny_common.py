"""Helpers the tiny-repo builders share: seeding, repo folders, JSON files and sharded safetensors."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import torch

TINY_MARKER = ".diffsynth_tiny_model"
# Shard limits small enough that each sharded component is written in at least two files, like the real repos.
SHARD_SIZE = "100KB"


@contextlib.contextmanager
def seeded(seed: int):
    """Seeds torch's global generator for one component without disturbing the caller's random state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")


def prepare_repo(root: Path, model_id: str) -> Path:
    """Creates an empty repo folder; refuses to delete a folder this module did not write (it may hold real weights)."""
    repo = Path(root) / model_id
    if repo.exists():
        if not (repo / TINY_MARKER).is_file():
            raise FileExistsError(
                f"{repo} exists and is not a tiny model written by this module (no {TINY_MARKER}); it may hold the "
                "real weights. Choose another --output folder, or delete it yourself"
            )
        shutil.rmtree(repo)
    repo.mkdir(parents=True)
    (repo / TINY_MARKER).write_text("random-weight test model written by diffsynth.testing.tiny_models\n")
    return repo


def model_index(pipeline: str, components: dict[str, tuple[str, str]], **config: object) -> dict:
    """A diffusers ``model_index.json``: the pipeline class, its components and pipeline-level config."""
    import diffusers

    index = {"_class_name": pipeline, "_diffusers_version": diffusers.__version__, **config}
    index.update({name: [library, cls] for name, (library, cls) in components.items()})
    return index


def padded(size: int, multiple: int = 8) -> int:
    return (size + multiple - 1) // multiple * multiple


def save_sharded_safetensors(state_dict: dict[str, torch.Tensor], folder: Path, prefix: str) -> None:
    """Writes ``state_dict`` as ``<prefix>-0000i-of-0000n.safetensors`` shards plus ``<prefix>.safetensors.index.json``,
    the layout ``save_pretrained`` and the original Wan releases use."""
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    split = split_torch_state_dict_into_shards(state_dict, filename_pattern=prefix + "{suffix}.safetensors",
                                               max_shard_size=SHARD_SIZE)
    for filename, keys in split.filename_to_tensors.items():
        save_file({key: state_dict[key].contiguous() for key in keys}, str(folder / filename))
    if split.is_sharded:
        index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
        write_json(folder / f"{prefix}.safetensors.index.json", index)


def link_or_copy(source: str, destination: str) -> None:
    """Hard-links a file (the shared parts stay one copy on disk), copying where the file system refuses links."""
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)
