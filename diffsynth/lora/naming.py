"""Layer names of a denoiser in its original release's code, which the tools users generate with run.

diffusers renames some models' modules: Wan's ``blocks.0.attn1.to_q`` is ``blocks.0.self_attn.q`` in the original Wan
code, which ComfyUI, DiffSynth-Studio and musubi-tuner run, so a LoRA file for those tools must name its layers the
original ("native") way. Qwen-Image's original release uses diffusers' names, so its naming is the identity.

Only layers a LoRA can wrap (Linear and convolution layers) are mapped; norms and embeddings tables are not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

_BLOCK = re.compile(r"^(?P<blocks>blocks)\.(?P<index>\d+)\.(?P<layer>.+)$")
LORA_TARGET_TYPES = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)


@dataclass(frozen=True)
class ModuleNaming:
    """A one-to-one map between a model's diffusers layer names and its original release's names.

    Args:
        name: What the native naming is called in messages (e.g. ``"original Wan"``).
        block_layers: diffusers -> native names of the layers inside each ``blocks.<i>`` block.
        top_layers: diffusers -> native names of the layers outside the blocks.
        identity: The native names are the diffusers names (the two tables are then unused).
        universal_prefix: What the universal layout puts before each native name: ``diffusion_model.``, which
            ComfyUI's key maps take for most models, or nothing where ComfyUI reads the names bare (FLUX.2).
    """

    name: str
    block_layers: Mapping[str, str] = field(default_factory=dict)
    top_layers: Mapping[str, str] = field(default_factory=dict)
    identity: bool = False
    universal_prefix: str = "diffusion_model."

    def __post_init__(self) -> None:
        for table in (self.block_layers, self.top_layers):
            if len(set(table.values())) != len(table):
                raise ValueError(f"{self.name} naming maps two diffusers layers to one native name: {dict(table)}")

    def to_native(self, name: str) -> str | None:
        """The native name of diffusers layer ``name``, or None when the original code has no such layer."""
        if self.identity:
            return name
        block = _BLOCK.match(name)
        if block is None:
            return self.top_layers.get(name)
        layer = self.block_layers.get(block["layer"])
        return None if layer is None else f"blocks.{block['index']}.{layer}"

    def to_diffusers(self, native: str) -> str | None:
        """The diffusers name of native layer ``native``, or None when it names no mapped layer."""
        if self.identity:
            return native
        block = _BLOCK.match(native)
        if block is None:
            return _inverse(self.top_layers).get(native)
        layer = _inverse(self.block_layers).get(block["layer"])
        return None if layer is None else f"blocks.{block['index']}.{layer}"


def _inverse(table: Mapping[str, str]) -> dict[str, str]:
    return {native: name for name, native in table.items()}


DIFFUSERS_NAMING = ModuleNaming("diffusers", identity=True)

# From the original Wan code's module tree (its self_attn/cross_attn/ffn blocks and embedding Sequentials), as
# diffusers' own Wan checkpoint converter maps them.
WAN_NAMING = ModuleNaming(
    "original Wan",
    block_layers={
        "attn1.to_q": "self_attn.q", "attn1.to_k": "self_attn.k", "attn1.to_v": "self_attn.v",
        "attn1.to_out.0": "self_attn.o",
        "attn2.to_q": "cross_attn.q", "attn2.to_k": "cross_attn.k", "attn2.to_v": "cross_attn.v",
        "attn2.to_out.0": "cross_attn.o", "attn2.add_k_proj": "cross_attn.k_img",
        "attn2.add_v_proj": "cross_attn.v_img",
        "ffn.net.0.proj": "ffn.0", "ffn.net.2": "ffn.2",
    },
    top_layers={
        "patch_embedding": "patch_embedding", "proj_out": "head.head",
        "condition_embedder.text_embedder.linear_1": "text_embedding.0",
        "condition_embedder.text_embedder.linear_2": "text_embedding.2",
        "condition_embedder.time_embedder.linear_1": "time_embedding.0",
        "condition_embedder.time_embedder.linear_2": "time_embedding.2",
        "condition_embedder.time_proj": "time_projection.1",
        "condition_embedder.image_embedder.ff.net.0.proj": "img_emb.proj.1",
        "condition_embedder.image_embedder.ff.net.2": "img_emb.proj.3",
    },
)  # fmt: skip

# Keyed by the diffusers class of the model a LoRA is trained on; other classes keep their diffusers names.
NAMINGS: dict[str, ModuleNaming] = {
    "WanTransformer3DModel": WAN_NAMING,
    "QwenImageTransformer2DModel": ModuleNaming("original Qwen-Image", identity=True),
    # DiffSynth-Studio's Flux2DiT keeps diffusers' module names. ComfyUI runs BFL's fused layout, and its Flux key map
    # (comfy/lora.py with comfy/utils.flux_to_diffusers) takes diffusers names bare or under transformer., landing
    # to_q/to_k/to_v on slices of the fused qkv, but never under diffusion_model.: so the names are written bare.
    "Flux2Transformer2DModel": ModuleNaming("DiffSynth-Studio FLUX.2", identity=True, universal_prefix=""),
    # The released Z-Image transformers (and DiffSynth-Studio's ZImageDiT) use diffusers' names. ComfyUI's NextDiT
    # fuses attention.qkv and renames to_out.0 to attention.out, but its Lumina2 LoRA key map (comfy/lora.py with
    # comfy/utils.z_image_to_diffusers) takes diffusers' names and lands to_q/to_k/to_v on slices of qkv.
    "ZImageTransformer2DModel": ModuleNaming("original Z-Image", identity=True),
}


def naming_for(model: torch.nn.Module | str) -> ModuleNaming:
    """The native naming of ``model`` (a module or its diffusers class name); identity for unknown classes."""
    class_name = model if isinstance(model, str) else type(model).__name__
    return NAMINGS.get(class_name, DIFFUSERS_NAMING)


def lora_layer_names(model: torch.nn.Module) -> list[str]:
    """The names of ``model``'s layers a LoRA can wrap (Linear and convolution), peft wrappers seen through."""
    names = []
    for name, module in model.named_modules():
        if isinstance(module, LORA_TARGET_TYPES) and ".lora_" not in name:
            names.append(name.removesuffix(".base_layer"))
    return names
