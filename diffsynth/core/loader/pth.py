"""Reading ``.pth`` state dicts of the original Wan releases, with PyTorch's restricted loader only.

The original Wan repositories ship their text encoder, VAE and CLIP image encoder as ``.pth`` files
(``models_t5_umt5-xxl-enc-bf16.pth``, ``Wan2.1_VAE.pth``, ...). A ``.pth`` file is a pickle, and an ordinary
unpickler runs whatever code the file names. This module is the project's one reader of such files and it calls only
``torch.load(path, weights_only=True, mmap=True)``:

- ``weights_only=True`` is PyTorch's restricted unpickler: it rebuilds only tensors, storages and plain containers and
  numbers from an allow-list, and refuses every other global a pickle names, so a file cannot run code while loading.
  Whatever it refuses stays refused here; there is no fallback to a full unpickler.
- ``mmap=True`` maps the tensor data instead of reading it, so a 14B file costs no host memory until a tensor is
  used, and loading copies each tensor once, into the model. Files in PyTorch's old (pre-1.6) format cannot be
  mapped and are refused with a message saying how to re-save them.

The result must be a flat ``{name: tensor}`` dict; anything else (a list, a number among the values, a nested dict) is
refused with the file's name, so a checkpoint of another kind fails before any model is built.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

from .errors import ModelLoadError

PTH_SUFFIX = ".pth"
_REDOWNLOAD = "delete it and run again to re-download it"
_TRUNCATED = f"it is probably truncated by an interrupted download or copy: {_REDOWNLOAD}"


def read_pth_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Maps a ``.pth`` state dict with ``torch.load(weights_only=True, mmap=True)`` and checks it holds only tensors.

    Args:
        path: The ``.pth`` file.

    Returns:
        ``{name: tensor}``; the tensors are views of the mapped file (no data is read until they are used).

    Raises:
        ModelLoadError: The file is missing, truncated or not a PyTorch zip checkpoint, holds objects the restricted
            loader refuses, or is not a flat dict of tensors. The message names the file and the fix.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"{path} does not exist; download the repository's file again")
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as error:
        first_line = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        raise ModelLoadError(
            f"{path} holds objects beyond tensors, which PyTorch's restricted loader (weights_only=True) refuses "
            f"({first_line}); this project never unpickles code. Use the repository's original file, or a "
            "safetensors copy of the weights"
        ) from None
    except RuntimeError as error:
        message = str(error)
        if "mmap can only be used" in message:
            raise ModelLoadError(
                f"{path} is not a PyTorch zip checkpoint (it may be a pre-1.6 torch.save file, or not a checkpoint "
                "at all), so it cannot be memory-mapped; re-save its state dict with a current torch.save, or "
                f"{_REDOWNLOAD}"
            ) from None
        raise ModelLoadError(f"{path} cannot be read ({message.splitlines()[0]}); {_TRUNCATED}") from None
    except (OSError, EOFError, ValueError) as error:
        raise ModelLoadError(f"{path} cannot be read ({type(error).__name__}: {error}); {_TRUNCATED}") from None
    _check_flat_tensors(path, state)
    return state


def _check_flat_tensors(path: Path, state: object) -> None:
    if not isinstance(state, dict):
        raise ModelLoadError(
            f"{path} holds a {type(state).__name__}, not a state dict ({{name: tensor}}); it is not a model "
            "checkpoint this loader reads: use the repository's original file"
        )
    for key, value in state.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise ModelLoadError(
                f"{path} holds a {type(value).__name__} under key {key!r}, not only tensors; it is not a plain "
                "state dict (a training checkpoint or another tool's format?): use the repository's original file"
            )


class PthCheckpoint:
    """A ``.pth`` state dict behind the small interface the shard loader reads (``keys``, ``shape``, ``get_tensor``).

    Use as a context manager, like ``safetensors.safe_open``.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._state = read_pth_state_dict(self.path)

    def __enter__(self) -> PthCheckpoint:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._state = {}

    def keys(self) -> list[str]:
        """The tensor names, in file order."""
        return list(self._state)

    def shape(self, key: str) -> tuple[int, ...]:
        """The shape of one tensor (no data is read)."""
        return tuple(self._state[key].shape)

    def get_tensor(self, key: str) -> torch.Tensor:
        """One tensor, still backed by the mapped file (``Tensor.to`` copies it where it is cast or moved)."""
        return self._state[key]
