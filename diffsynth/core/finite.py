"""The finite-values check for tensors crossing a file boundary: weights written (LoRA files, checkpoints) and weights
read back (LoRA files a user passes in).

A NaN or inf weight is never useful: written, it makes every later resume or inference produce NaN (an all-black
image); read, it would start training from a broken state. One helper, so that every writer and reader refuses them
alike and names the tensors.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

_NAMES_SHOWN = 5


class NonFiniteTensorError(ValueError):
    """Tensors hold NaN or inf values; ``names`` lists them."""

    def __init__(self, message: str, names: list[str]):
        super().__init__(message)
        self.names = names


def is_finite(tensor: torch.Tensor) -> bool:
    """Whether every value of ``tensor`` is finite (integer and bool tensors always are).

    One pass over the tensor; a float8 format without an ``isfinite`` kernel is compared in float32, one tensor at a
    time.
    """
    if not (tensor.is_floating_point() or tensor.is_complex()):
        return True
    try:
        return bool(torch.isfinite(tensor).all())
    except (NotImplementedError, RuntimeError):
        return bool(torch.isfinite(tensor.float()).all())


def nonfinite_names(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """The names of the tensors in ``tensors`` that hold a NaN or inf value, in the mapping's order."""
    return [name for name, tensor in tensors.items() if not is_finite(tensor)]


def require_finite(tensors: Mapping[str, torch.Tensor], what: str) -> None:
    """Raises unless every tensor in ``tensors`` is finite.

    Args:
        tensors: The tensors by name, e.g. a state dict about to be saved or just loaded.
        what: What they are, starting the message, e.g. ``"not writing out/step-3.safetensors"`` or
            ``"--lora_checkpoint a.safetensors"``.

    Raises:
        NonFiniteTensorError: Some tensors hold NaN or inf; the message names up to five of them and the count.
    """
    names = nonfinite_names(tensors)
    if not names:
        return
    shown = ", ".join(names[:_NAMES_SHOWN]) + (f", and {len(names) - _NAMES_SHOWN} more" if len(names) > _NAMES_SHOWN
                                                else "")
    raise NonFiniteTensorError(f"{what}: NaN or inf values in {len(names)} of {len(tensors)} tensors ({shown})", names)
