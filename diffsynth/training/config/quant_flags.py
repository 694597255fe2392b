"""``--quant_options`` read as a flag: the semicolon list of ``<model>:<method>[/<excluded layers>]`` entries (see
``placement.quant_options`` for what the entries do to the loaded models). Parsed while the flags are checked; the
method table comes from ``core.quant``.
"""

from __future__ import annotations

from ...core.quant import QuantConfig
from .errors import split_csv

FLAG = "--quant_options"
EXAMPLE = "Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors:bitsandbytes_nf4/img_mod.1,proj_out"


def packed_releases(model_id_with_origin_paths: str | None, model_paths: str | None) -> list[str]:
    """The releases packed in bitsandbytes' 4-bit layout (``FamilySpec.bitsandbytes_model_ids``) among the models the
    flags load: they load 4-bit whatever ``--quant_options`` says, so what cannot move 4-bit weights is refused for
    them as for it."""
    from ...pipelines.registry import bitsandbytes_model_ids

    models = f"{model_id_with_origin_paths or ''} {model_paths or ''}".lower()
    return [prefix for prefix in bitsandbytes_model_ids() if prefix.lower() in models]


def packed_weights_flag(model_id_with_origin_paths: str | None, model_paths: str | None,
                        quant_options: str | None) -> str | None:
    """What makes the run's weights 4-bit, for messages: ``--quant_options``, a packed release, or None."""
    if quant_options:
        return FLAG
    packed = packed_releases(model_id_with_origin_paths, model_paths)
    return f"the 4-bit release {packed[0]}" if packed else None


def parse_quant_options(value: str | None) -> dict[str, QuantConfig]:
    """The entries of ``--quant_options`` by model string.

    Raises:
        ValueError: An entry has no ``:<method>``, names an unknown method, or a model twice.
    """
    options: dict[str, QuantConfig] = {}
    for entry in (part.strip() for part in (value or "").split(";")):
        if not entry:
            continue
        model, colon, spec = entry.rpartition(":")
        if not colon or not model or not spec:
            raise ValueError(f"{FLAG}: entry {entry!r} is not <model>:<method>[/<excluded layers>]; e.g. {EXAMPLE}")
        method, _, excluded = spec.partition("/")
        if model in options:
            raise ValueError(f"{FLAG} names {model} twice; give each model one entry")
        try:
            options[model] = QuantConfig(method, split_csv(excluded))
        except ValueError as error:
            raise ValueError(f"{FLAG}: entry {entry!r}: {error}") from None
    return options
