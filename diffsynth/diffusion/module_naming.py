"""How a denoiser's layers are named in its original release's code, which the tools users generate with run.

diffusers renames some models' modules: Wan's ``blocks.0.attn1.to_q`` is ``blocks.0.self_attn.q`` in the original Wan
code, which ComfyUI, DiffSynth-Studio and musubi-tuner run, so a LoRA file for those tools must name its layers the
original ("native") way. :class:`ModuleNaming` is that one-to-one map; a family declares its own in its room
(``pipelines/<family>/naming.py``) and names it in its spec. Some original releases fuse layers diffusers keeps apart
(BFL's FLUX.1 computes ``to_q``, ``to_k`` and ``to_v`` as one ``img_attn.qkv`` layer): :class:`FusedNaming` names
those.

Only layers a LoRA can wrap (Linear and convolution layers) are mapped; norms and embeddings tables are not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

_ANY_BLOCK = re.compile(r"^(?P<blocks>[a-z_]+)\.(?P<index>\d+)\.")


def swap_halves(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` with the two halves of its rows exchanged (BFL's final modulation against diffusers'); its own
    inverse."""
    first, second = tensor.chunk(2, dim=0)
    return torch.cat([second, first])


@dataclass(frozen=True)
class FusedLayer:
    """A layer of an original release that holds one or more diffusers layers as consecutive blocks of its rows.

    Args:
        parts: The diffusers layers in row order; ``{}`` stands for the block index.
        widths: With several parts, each part's rows as a multiple of the layer's input width (FLUX.1's attention
            projections keep the hidden size, its single blocks' MLP widens it four times).
        swapped_halves: The two halves of the rows come in the other order than in diffusers (BFL's final modulation
            yields shift then scale, diffusers' scale then shift).
    """

    parts: tuple[str, ...]
    widths: tuple[int, ...] = ()
    swapped_halves: bool = False

    def __post_init__(self) -> None:
        if len(self.parts) > 1 and len(self.widths) != len(self.parts):
            raise ValueError(f"fused layer of {self.parts} needs one width per part, not {self.widths}")

    def split_rows(self, rows: torch.Tensor, in_features: int) -> list[torch.Tensor]:
        """The rows of ``rows`` (a LoRA's up factor, or a weight) that belong to each part, in diffusers' order.

        Raises:
            ValueError: ``rows`` is not as tall as the parts of a layer ``in_features`` wide.
        """
        if self.swapped_halves:
            rows = swap_halves(rows)
        if len(self.parts) == 1:
            return [rows]
        sizes = self.row_counts(in_features)
        if sum(sizes) != rows.shape[0]:
            raise ValueError(f"it has {rows.shape[0]} rows, but the {len(self.parts)} layers in it have {sum(sizes)} "
                             f"when {in_features} wide ({', '.join(map(str, sizes))})")
        return list(rows.split(sizes))

    def row_counts(self, in_features: int) -> list[int]:
        """How many rows each part has in a layer ``in_features`` wide (several parts only)."""
        return [width * in_features for width in self.widths]

    def join_rows(self, blocks: list[torch.Tensor]) -> torch.Tensor:
        """The inverse of :meth:`split_rows`: the parts' rows stacked in the original layer's order."""
        rows = torch.cat(blocks)
        return swap_halves(rows) if self.swapped_halves else rows


def _as_pattern(name: str) -> tuple[str, str | None]:
    """``transformer_blocks.3.attn.to_q`` -> ``("transformer_blocks.{}.attn.to_q", "3")``; a name outside the
    block lists comes back as it is, with no index."""
    block = _ANY_BLOCK.match(name)
    if block is None:
        return name, None
    return f"{block['blocks']}.{{}}.{name[block.end():]}", block["index"]


@dataclass(frozen=True)
class FusedNaming:
    """An original release's layer names where one layer may hold several diffusers layers (:class:`FusedLayer`).

    Args:
        name: What the naming is called in messages (e.g. ``"BFL FLUX.1"``).
        layers: Native layer name -> the diffusers layers it holds; ``{}`` stands for the block index in both.
    """

    name: str
    layers: Mapping[str, FusedLayer]

    def locate(self, name: str) -> tuple[str, int] | None:
        """``(native layer, part index)`` of diffusers layer ``name``; None where the original code has none."""
        pattern, index = _as_pattern(name)
        for native, layer in self.layers.items():
            if pattern in layer.parts:
                return native.format(index), layer.parts.index(pattern)
        return None

    def parts(self, native: str) -> tuple[FusedLayer, list[str]] | None:
        """The fused layer ``native`` names and its diffusers layers in row order; None when it names none."""
        pattern, index = _as_pattern(native)
        layer = self.layers.get(pattern)
        return None if layer is None else (layer, [part.format(index) for part in layer.parts])

    def from_underscored(self, stem: str) -> str | None:
        """The native name a kohya key spells with underscores (``double_blocks_0_img_attn_qkv``), or None."""
        for native in self.layers:
            pieces = [re.escape(piece.replace(".", "_")) for piece in native.split("{}")]
            match = re.fullmatch(r"(\d+)".join(pieces), stem)
            if match is not None:
                return native.format(*match.groups())
        return None


@dataclass(frozen=True)
class ModuleNaming:
    """A one-to-one map between a model's diffusers layer names and its original release's names.

    Args:
        name: What the native naming is called in messages (e.g. ``"original Wan"``).
        block_layers: diffusers -> native names of the layers inside each ``<block_list>.<i>`` block.
        top_layers: diffusers -> native names of the layers outside the blocks.
        identity: The native names are the diffusers names (the two tables are then unused).
        universal_prefix: What the universal layout puts before each native name: ``diffusion_model.``, which
            ComfyUI's key maps take for most models, nothing where ComfyUI reads the names bare (FLUX.2), or
            ``transformer.`` where diffusers' loader needs it and ComfyUI and DiffSynth-Studio take it too (FLUX.1).
        fused: The original release's fused layers, which kohya files name instead of the native names (FLUX.1's
            BFL layout); None where kohya files use the native names.
        fused_layouts: The file layouts that name ``fused``'s layers: kohya alone (FLUX.1, whose universal files
            keep diffusers' names for ComfyUI), or the universal layout too where the original code's names are what
            its tools read (Ideogram 4).
        block_list: The name of the list of blocks in both namings (``blocks`` for Wan, ``transformer_blocks`` for
            LTX-2).
        other_block_lists: Further lists of blocks named alike in both namings, whose blocks' layers ``block_layers``
            maps too (Wan VACE's ``vace_blocks``).
        kohya_only: The trainer writes this model's LoRA files in the kohya layout whatever the flags say: the one
            layout its tools all read (Stable Diffusion's UNet, whose ``diffusion_model.`` names in ComfyUI are the
            original LDM ones).
    """

    name: str
    block_layers: Mapping[str, str] = field(default_factory=dict)
    top_layers: Mapping[str, str] = field(default_factory=dict)
    identity: bool = False
    universal_prefix: str = "diffusion_model."
    fused: FusedNaming | None = None
    fused_layouts: tuple[str, ...] = ("kohya",)
    block_list: str = "blocks"
    other_block_lists: tuple[str, ...] = ()
    kohya_only: bool = False

    def __post_init__(self) -> None:
        for table in (self.block_layers, self.top_layers):
            if len(set(table.values())) != len(table):
                raise ValueError(f"{self.name} naming maps two diffusers layers to one native name: {dict(table)}")

    def fuses(self, layout: str) -> bool:
        """Whether files of ``layout`` name the original release's fused layers (``fused``)."""
        return self.fused is not None and layout in self.fused_layouts

    def to_native(self, name: str) -> str | None:
        """The native name of diffusers layer ``name``, or None when the original code has no such layer."""
        if self.identity:
            return name
        block = self._block(name)
        if block is None:
            return self.top_layers.get(name)
        layer = self.block_layers.get(block["layer"])
        return None if layer is None else f"{block['list']}.{block['index']}.{layer}"

    def to_diffusers(self, native: str) -> str | None:
        """The diffusers name of native layer ``native``, or None when it names no mapped layer."""
        if self.identity:
            return native
        block = self._block(native)
        if block is None:
            return _inverse(self.top_layers).get(native)
        layer = _inverse(self.block_layers).get(block["layer"])
        return None if layer is None else f"{block['list']}.{block['index']}.{layer}"

    def _block(self, name: str) -> re.Match | None:
        """The ``index`` and ``layer`` of a name inside the block list, or None outside it."""
        lists = "|".join(re.escape(each) for each in (self.block_list, *self.other_block_lists))
        return re.match(rf"^(?P<list>{lists})\.(?P<index>\d+)\.(?P<layer>.+)$", name)


def _inverse(table: Mapping[str, str]) -> dict[str, str]:
    return {native: name for name, native in table.items()}


DIFFUSERS_NAMING = ModuleNaming("diffusers", identity=True)
