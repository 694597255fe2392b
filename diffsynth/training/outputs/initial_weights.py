"""The reference's ``--resume_from_checkpoint FILE``: start training from a weights file (e.g. a full fine-tune's
``epoch-4.safetensors``), with a fresh optimizer and schedule.

The flag has two meanings here, told apart by what it names: ``latest`` or a folder is a training-state checkpoint
(the whole run resumes: weights, optimizer, schedule, data position; ``checkpoint.py``); a file (``.safetensors``) is
a weights file, read as the reference reads it: each key, prefixed with ``--remove_prefix_in_ckpt`` (``pipe.dit.``),
names a weight of the training module, so the file holds the names the trainer writes for a full fine-tune. Its
weights are loaded over the pipeline's before anything else changes them (a preset LoRA merge, the LoRA, fp8).
``TrainingSection.initial_weights`` is such a file; it is checked against the model's skeleton before
any weight loads.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported by the callers; the flag checks here need none of it
    import torch

MODULE_PREFIX = "pipe."


def target_model(prefix: str) -> str | None:
    """The pipeline slot a prefix such as ``pipe.dit.`` loads into; None when the keys name it themselves."""
    rest = prefix[len(MODULE_PREFIX):] if prefix.startswith(MODULE_PREFIX) else prefix
    return rest.split(".")[0] or None


def _target_names(keys: list[str], prefix: str) -> dict[str, str]:
    """File key -> pipeline weight name (``dit.transformer_blocks.0...``)."""
    names = {}
    for key in keys:
        full = prefix + key
        names[key] = full[len(MODULE_PREFIX):] if full.startswith(MODULE_PREFIX) else full
    return names


def initial_weights_problems(path: str, prefix: str, models: Mapping[str, torch.nn.Module]) -> list[str]:
    """Checks a weights file against the models (skeletons will do: only names and shapes are read).

    Args:
        path: The file.
        prefix: ``--remove_prefix_in_ckpt``.
        models: Pipeline models by slot.
    """
    from safetensors import safe_open

    flag = f"--resume_from_checkpoint {path}"
    if not Path(path).is_file():
        return [f"{flag} does not exist; pass a .safetensors weights file (or a training-state folder, or latest)"]
    try:
        with safe_open(path, "pt") as file:
            shapes = {key: tuple(file.get_slice(key).get_shape()) for key in file.keys()}
    except Exception as error:  # safetensors raises its own error types for a damaged header
        return [f"{flag} is not a readable safetensors file ({error})"]
    if any(marker in key for key in shapes for marker in (".lora_", ".lora.", ".hada_", ".lokr_")):
        return [f"{flag} holds LoRA weights; continue a LoRA from it with --lora_checkpoint {path}"]
    own = {f"{slot}.{name}": tuple(tensor.shape) for slot, model in models.items()
           for name, tensor in model.state_dict().items()}
    names = _target_names(list(shapes), prefix)
    unknown = [key for key, name in names.items() if name not in own]
    if unknown:
        return [f"{flag}: {len(unknown)} of its {len(shapes)} weights name nothing in the models loaded (e.g. "
                f"{unknown[:3]} with --remove_prefix_in_ckpt {prefix!r} -> {[names[k] for k in unknown[:3]]}); pass "
                "the --remove_prefix_in_ckpt the file was written with (pipe.dit. for the transformer) and load that "
                "model"]
    reshaped = [key for key, name in names.items() if own[name] != shapes[key]]
    if reshaped:
        key = reshaped[0]
        return [f"{flag}: weight {key} has shape {shapes[key]}, the model's {own[names[key]]}; it was trained on "
                "another model"]
    return []


def load_initial_weights(pipe: torch.nn.Module, path: str, prefix: str,
                         flag: str = "--resume_from_checkpoint") -> int:
    """Loads a weights file over the pipeline's weights (in place); returns how many tensors were loaded.

    ``flag`` is the option that named the file, for the errors (a validation script's ``--checkpoint_path``).

    Raises:
        ValueError: A weight names nothing in the pipeline, or belongs to a model built without weights.
    """
    from safetensors.torch import load_file

    state = load_file(path)
    names = _target_names(list(state), prefix)
    own = dict(pipe.state_dict(keep_vars=True))
    meta = sorted({name.split(".")[0] for name in names.values() if name in own and own[name].is_meta})
    if meta:
        raise ValueError(f"{flag} {path} has weights for {meta}, which this stage holds without "
                         "weights (--offload_models); drop the flag here, or the model from --offload_models")
    _, unexpected = pipe.load_state_dict({names[key]: value for key, value in state.items()}, strict=False)
    if unexpected:
        raise ValueError(f"{flag} {path}: {unexpected[:3]} name nothing in the pipeline")
    return len(state)
