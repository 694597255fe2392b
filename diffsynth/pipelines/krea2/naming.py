"""Krea 2's layer names for LoRA files: Krea's own module tree (krea-ai/krea-2's ``SingleStreamDiT``), which the
reference's DiT and ComfyUI run and diffusers' ``_convert_non_diffusers_krea2_lora_to_diffusers`` reads.

diffusers calls the block lists ``transformer_blocks`` and ``text_fusion.{layerwise,refiner}_blocks`` where Krea
says ``blocks`` and ``txtfusion.{layerwise,refiner}_blocks``, so the block lists are renamed too.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from ...diffusion.module_naming import ModuleNaming

# diffusers -> Krea names of the block lists.
BLOCK_LISTS = {
    "transformer_blocks": "blocks",
    "text_fusion.layerwise_blocks": "txtfusion.layerwise_blocks",
    "text_fusion.refiner_blocks": "txtfusion.refiner_blocks",
}


@dataclass(frozen=True)
class Krea2Naming(ModuleNaming):
    """``ModuleNaming`` whose block lists have other names in the original code (``BLOCK_LISTS``)."""

    def to_native(self, name: str) -> str | None:
        return self._translate(name, BLOCK_LISTS, super().to_native)

    def to_diffusers(self, native: str) -> str | None:
        return self._translate(native, {new: old for old, new in BLOCK_LISTS.items()}, super().to_diffusers)

    @staticmethod
    def _translate(name: str, lists: dict[str, str], layer_name: Callable[[str], str | None]) -> str | None:
        """``name`` in the other naming: inside a block of one of ``lists``, its block renamed and its layer by
        ``layer_name`` (the base class's, on the shared ``blocks`` list); outside them, ``layer_name`` alone."""
        for source, target in lists.items():
            match = re.match(rf"^{re.escape(source)}\.(\d+)\.(.+)$", name)
            if match:
                layer = layer_name(f"blocks.{match[1]}.{match[2]}")
                return None if layer is None else f"{target}.{layer.removeprefix('blocks.')}"
        # A block name of the naming being translated to is no name of the one being translated from.
        if any(re.match(rf"^{re.escape(other)}\.\d+\.", name) for other in lists.values()):
            return None
        return layer_name(name)


NAMING = Krea2Naming(
    "original Krea 2",
    block_layers={
        "attn.to_q": "attn.wq", "attn.to_k": "attn.wk", "attn.to_v": "attn.wv", "attn.to_out.0": "attn.wo",
        "attn.to_gate": "attn.gate", "ff.gate": "mlp.gate", "ff.up": "mlp.up", "ff.down": "mlp.down",
    },
    top_layers={
        "img_in": "first", "time_embed.linear_1": "tmlp.0", "time_embed.linear_2": "tmlp.2",
        "time_mod_proj": "tproj.1", "txt_in.linear_1": "txtmlp.1", "txt_in.linear_2": "txtmlp.3",
        "text_fusion.projector": "txtfusion.projector", "final_layer.linear": "last.linear",
    },
)  # fmt: skip
