"""``--lora_target_modules`` in a model's module names: the reference's original names mapped through a pipeline's
aliases, the reference's empty list, and a model part's scope (the layers a LoRA on one part may wrap)."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence

import torch

logger = logging.getLogger(__name__)


TargetAliases = Mapping[str, "str | tuple[str, ...]"]
"""A pipeline's ``--lora_target_modules`` names from its model's original code: a string is the diffusers module
suffix the name means (Wan's ``q`` -> ``to_q``); a tuple holds regular expressions over whole diffusers module names,
for an original module diffusers splits in several (FLUX.1's fused ``a_to_qkv``) or whose suffix would also select
other layers."""


def aliased_targets(target_modules: Sequence[str], aliases: TargetAliases) -> list[str]:
    """``--lora_target_modules`` with each aliased name replaced by what it stands for (a suffix or patterns), without
    the model: the form a checkpoint records to compare runs."""
    names = []
    for target in target_modules:
        alias = aliases.get(target, target)
        names.extend((alias,) if isinstance(alias, str) else alias)
    return list(dict.fromkeys(names))


def effective_lora_targets(model: torch.nn.Module, targets: Sequence[str], pipeline_class: type) -> list[str]:
    """``targets``, or, when empty and the pipeline says so (``empty_lora_targets_train_all_linear``), the whole name
    of every ``nn.Linear`` of ``model``: the layers the reference's empty ``--lora_target_modules`` trains."""
    if targets or not pipeline_class.empty_lora_targets_train_all_linear:
        return list(targets)
    return [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]


def resolve_lora_targets(model: torch.nn.Module, target_modules: Sequence[str], aliases: TargetAliases,
                         model_name: str, scope: tuple[Sequence[str], Sequence[str]] = ((), ())) -> list[str]:
    """``--lora_target_modules`` in diffusers' module names (``aliases`` map a model's original names).

    A name aliased to patterns becomes the whole names of the modules they match. Works on a model built without
    weights too, so the trainer checks the targets before loading anything. Only the modules in ``scope``
    (``BasePipeline.part_scope``'s ``(inside, outside)``) count: a model part's layers (Wan2.2-Animate's face adapter)
    are neither trained nor named by a LoRA on the model around it.

    Raises:
        ValueError: An entry matches no module of ``model`` (matching is by dotted-name suffix, as peft does), or
            matches a layer the model's original code has no name for (the LoRA file could not name it for ComfyUI
            and DiffSynth-Studio).
    """
    from ...lora import lora_layer_names, naming_for

    names = [name for name, _ in model.named_modules() if _in_scope(name, *scope)]
    by_suffix = _by_suffix(names)
    renamed, matched = {}, {}
    for target in target_modules:
        alias = aliases.get(target, target)
        if isinstance(alias, str):
            matched.setdefault(alias, by_suffix.get(alias, []))
            if alias != target:
                renamed[target] = alias
            continue
        hits = [n for n in names if any(re.fullmatch(pattern, n) for pattern in alias)]
        renamed[target] = f"{len(hits)} modules"
        matched[target] = hits
    if renamed:
        logger.info("--lora_target_modules: original module names mapped to diffusers' names %s", renamed)
    unmatched = [t for t, hits in matched.items() if not hits]
    if unmatched:
        raise ValueError(f"--lora_target_modules entries {unmatched} match no module of {model_name} "
                         f"({type(model).__name__}); name modules by their path suffix, e.g. 'to_q' or "
                         "'img_mlp.net.2'")
    naming, layers = naming_for(model), set(lora_layer_names(model))
    unnamed = sorted({t for t, hits in matched.items() for n in hits if n in layers and naming.to_native(n) is None})
    if unnamed:
        raise ValueError(f"--lora_target_modules entries {unnamed} select layers of {model_name} that the "
                         f"{naming.name} code has no name for, so ComfyUI and DiffSynth-Studio could not load their "
                         "LoRA; leave them out")
    targets = []
    for target, hits in matched.items():
        targets.extend((target,) if target not in aliases or isinstance(aliases[target], str) else hits)
    return list(dict.fromkeys(targets))


def _by_suffix(names: Sequence[str]) -> dict[str, list[str]]:
    """Each module name under every dotted suffix of it (peft's matching): a script naming hundreds of layers (the
    reference's SDXL LoRA) looks each up at once instead of scanning every module per entry."""
    index: dict[str, list[str]] = {}
    for name in names:
        parts = name.split(".")
        for start in range(len(parts)):
            index.setdefault(".".join(parts[start:]), []).append(name)
    return index


def _in_scope(name: str, inside: Sequence[str], outside: Sequence[str]) -> bool:
    """Whether a module path lies within one of the child modules ``inside`` (any, when empty) and in none of
    ``outside``."""

    def within(children: Sequence[str]) -> bool:
        return any(name == child or name.startswith(f"{child}.") for child in children)

    return (not inside or within(inside)) and not within(outside)


def scoped_targets(model: torch.nn.Module, targets: list[str], inside: Sequence[str],
                   outside: Sequence[str]) -> list[str]:
    """``targets`` as the whole names of the layers they select within the child modules ``inside`` (all when empty)
    and outside those of ``outside`` (a model part's, ``BasePipeline.model_parts``); unchanged without either.

    Raises:
        ValueError: No selected layer lies in that scope.
    """
    if not inside and not outside:
        return targets
    scoped = [name for name, _ in model.named_modules() if _in_scope(name, inside, outside)]
    by_suffix = _by_suffix(scoped)
    selected = {name for target in targets for name in by_suffix.get(target, [])}
    names = [name for name in scoped if name in selected]
    if not names:
        raise ValueError(f"--lora_target_modules {','.join(targets)} select no layer of {type(model).__name__} in "
                         f"{', '.join(inside) or 'its main blocks'}; name layers those modules have, e.g. 'q,k,v,o'")
    return names
