"""``--quant_options`` read as a flag: the semicolon list of ``<model>:<method>[/<excluded layers>]`` entries (see
``placement.quant_options`` for what the entries do to the loaded models). Parsed while the flags are checked; the
method table comes from ``core.quant``.
"""

from __future__ import annotations

from ...core.quant import QuantConfig
from .errors import split_csv

FLAG = "--quant_options"
EXAMPLE = "Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors:bitsandbytes_nf4/img_mod.1,proj_out"


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
