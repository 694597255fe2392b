"""The trained adapter of ``--lora_base_model``: peft's LoRA, DoRA, LoHa or LoKr injected, and started from a file.

``--lora_type`` picks peft's ``LoraConfig`` (``--use_dora``: ``use_dora=True``), ``LoHaConfig`` or ``LoKrConfig``
(``--lokr_factor``: its ``decompose_factor``), each with ``--lora_rank`` and ``--lora_alpha``. The adapter's weights
train in float32 whatever the base dtype: bf16 updates of small factors lose most bits.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from ...core.finite import NonFiniteTensorError
from ..config.errors import FlagError

# Parameter names of peft's adapters: LoRA's lora_A / lora_B / lora_magnitude_vector, LoHa's hada_*, LoKr's lokr_*.
ADAPTER_MARKERS = (".lora_", ".hada_", ".lokr_")
TYPE_NAMES = {"lora": "LoRA", "lora+dora": "DoRA (a LoRA with --use_dora)", "loha": "LoHa", "lokr": "LoKr"}


def is_adapter_parameter(name: str) -> bool:
    """Whether a parameter name belongs to a peft adapter (not to the model it wraps)."""
    return any(marker in name for marker in ADAPTER_MARKERS)


@dataclass(frozen=True)
class AdapterSettings:
    """The adapter flags: ``--lora_type``, ``--lora_rank``, ``--lora_alpha``, ``--use_dora``, ``--lokr_factor``."""

    lora_type: str = "lora"
    rank: int = 32
    alpha: float = 32.0
    use_dora: bool = False
    lokr_factor: int = -1

    @property
    def kind(self) -> str:
        """``lora``, ``lora+dora``, ``loha`` or ``lokr``: what a file of this adapter records."""
        return "lora+dora" if self.use_dora else self.lora_type

    @property
    def scale(self) -> float:
        """peft's scale of every type: ``alpha / r``."""
        return self.alpha / self.rank

    def peft_config(self, target_modules: list[str]):
        """peft's config of this adapter on ``target_modules``.

        Raises:
            ValueError: An unknown ``lora_type``.
        """
        from peft import LoHaConfig, LoKrConfig, LoraConfig

        if self.lora_type == "lora":
            options = {"use_dora": True} if self.use_dora else {}
            return LoraConfig(r=self.rank, lora_alpha=self.alpha, target_modules=target_modules,
                              init_lora_weights=True, **options)
        if self.lora_type == "loha":
            return LoHaConfig(r=self.rank, alpha=self.alpha, target_modules=target_modules, init_weights=True)
        if self.lora_type == "lokr":
            return LoKrConfig(r=self.rank, alpha=self.alpha, target_modules=target_modules, init_weights=True,
                              decompose_factor=self.lokr_factor)
        raise ValueError(f"--lora_type {self.lora_type}: unknown adapter type; choose lora, loha or lokr")


def inject_adapter(model: torch.nn.Module, settings: AdapterSettings, target_modules: list[str]) -> None:
    """Injects the adapter into ``model``; its weights become float32 and trainable."""
    from peft import inject_adapter_in_model

    inject_adapter_in_model(settings.peft_config(target_modules), model)
    for name, param in model.named_parameters():
        if is_adapter_parameter(name):
            param.data = param.data.float()
            param.requires_grad_(True)


class DoraBaseWeights(Mapping[str, torch.Tensor]):
    """The float32 base weights of the layers of a model that carry a DoRA magnitude, by layer name, each read when
    asked for (one layer's copy at a time): a DoRA file's ``dora_scale`` is computed from them."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.layers = {name: module for name, module in model.named_modules()
                       if "default" in getattr(module, "lora_magnitude_vector", {})}

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.layers[name].get_base_layer().weight.detach().float()

    def __iter__(self) -> Iterator[str]:
        return iter(self.layers)

    def __len__(self) -> int:
        return len(self.layers)


def own_weights(model: torch.nn.Module, settings: AdapterSettings):
    """The injected adapter of ``model`` as :class:`~diffsynth.lora.formats.LoRAWeights` (shapes and names)."""
    from ...lora.peft_adapters import is_peft_adapter_key, weights_from_peft

    state = {name: param.detach() for name, param in model.named_parameters() if is_peft_adapter_key(name)}
    return weights_from_peft(state, settings.alpha, settings.rank, base_weights=DoraBaseWeights(model))


def load_adapter_checkpoint(model: torch.nn.Module, path: Path, settings: AdapterSettings) -> None:
    """Starts the injected adapter from an adapter file of any layout, at the weight change the file describes.

    The file's change is kept exactly: its scale is folded into the factor peft scales (``lora_B``, ``hada_w1_a``,
    ``lokr_w1``), so a file with its scale folded in, or trained with another alpha, continues from the same change;
    a DoRA file's ``dora_scale`` becomes peft's magnitude again, from the base weights.

    Raises:
            FlagError: The file is missing, unreadable, of another adapter type, or made for other targets, another
                rank or another model.
            NonFiniteTensorError: The file holds NaN or inf values (a diverged run's).
    """
    from ...lora import lora_layer_names, naming_for, read_lora
    from ...lora.peft_adapters import layer_structure, peft_values

    own = own_weights(model, settings)
    try:
        loaded = read_lora(path, lora_layer_names(model), naming_for(model))
    except NonFiniteTensorError as error:  # exit code 3, as for any diverged file
        raise NonFiniteTensorError(f"--lora_checkpoint {path}: {error}", error.names) from None
    except (FileNotFoundError, ValueError) as error:
        raise FlagError([f"--lora_checkpoint {path}: {error}"]) from None
    kind = loaded.describe()["type"]
    if kind != settings.kind:
        raise FlagError([f"--lora_checkpoint {path} is a {TYPE_NAMES.get(kind, kind)} file, and this run trains a "
                         f"{TYPE_NAMES[settings.kind]}: pass {_flags_for(kind)} to continue it, or start from a "
                         f"{TYPE_NAMES[settings.kind]} file"])
    made_with = loaded.metadata.get("lora_target_modules") or ", ".join(loaded.describe()["targets"])
    missing, extra = sorted(set(own.layers) - set(loaded.layers)), sorted(set(loaded.layers) - set(own.layers))
    if missing or extra:
        raise FlagError([f"--lora_checkpoint {path} has LoRA layers for other modules than this run trains "
                         f"(missing {missing[:3]}, extra {extra[:3]}): it was made with --lora_target_modules "
                         f"{made_with!r}; pass those targets"])
    for name, layer in loaded.layers.items():
        target = own.layers[name]
        if layer.rank != target.rank and kind in ("lora", "lora+dora"):
            raise FlagError([f"--lora_checkpoint {path} has rank {layer.rank} but --lora_rank is {target.rank}; "
                             f"pass --lora_rank {layer.rank}"])
        if layer_structure(layer) != layer_structure(target):
            raise FlagError([f"--lora_checkpoint {path}: layer {name!r} has factors {layer_structure(layer)}; this "
                             f"run's are {layer_structure(target)}: it was trained with another --lora_rank"
                             f"{' or --lokr_factor' if kind == 'lokr' else ''}, or on another model"])
    values = peft_values(loaded, settings.scale, DoraBaseWeights(model))
    parameters = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in values.items():
            parameters[name].copy_(value)


def _flags_for(kind: str) -> str:
    return {"lora": "--lora_type lora", "lora+dora": "--lora_type lora --use_dora", "loha": "--lora_type loha",
            "lokr": "--lora_type lokr"}.get(kind, "the flags it was trained with")

