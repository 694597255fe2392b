"""The adapters besides plain LoRA: LoHa, LoKr and DoRA's magnitude, each with the exact weight change it makes.

===== ============================================================= ==============================================
type  file keys of one layer (after the layer's name)                 weight change ``delta(W)``
===== ============================================================= ==============================================
loha  ``hada_w1_a``, ``hada_w1_b``, ``hada_w2_a``, ``hada_w2_b``,    ``s * (w1_a @ w1_b) * (w2_a @ w2_b)``
      ``alpha``                                                     (element-wise product), ``s = alpha / rank``
lokr  ``lokr_w1`` or ``lokr_w1_a``/``lokr_w1_b``, ``lokr_w2`` or     ``s * kron(w1, w2)``; ``s = alpha / rank`` of the
      ``lokr_w2_a``/``lokr_w2_b``, ``alpha``                          last decomposed factor, 1 when neither is
dora  ``lora_A``/``lora_B`` (or ``lora_down``/``lora_up``),          ``d / (||W||_row + eps) * (W + s * up @ down) - W``
      ``dora_scale`` (shape ``(out, 1)``)                           with ``d`` the file's ``dora_scale``
===== ============================================================= ==============================================

These are the names and rules of LyCORIS, which ComfyUI (``comfy/weight_adapter``) reads. Two of ComfyUI's rules shape
the files written here:

* A LoKr layer whose two factors are both whole (neither ``w1`` nor ``w2`` decomposed) gets no scale in ComfyUI,
  whatever its ``alpha``: such layers are written with the scale folded into ``lokr_w1`` and no ``alpha``.
* ComfyUI normalises a ``dora_scale`` by the row norms of the BASE weight ``W``. peft's DoRA is
  ``W' = m * (W + s*B@A) / ||W + s*B@A||_row``, so the file holds ``d = m * (||W||_row + eps) / ||W + s*B@A||_row``
  (:func:`dora_scale_from_magnitude`, float32, from the base weights when the file is written), and ComfyUI computes
  ``W'`` exactly. LyCORIS stores ``m`` itself and divides by the norm of ``W + s*B@A``: its own loader reads these
  files differently (``docs/en/LoRA_Types.md``).

A file's metadata entry ``diffsynth.lora.type`` names the type (``loha``, ``lokr``, ``lora+dora``); a plain LoRA file
has none, as before.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch

ADAPTER_TYPES = ("lora", "loha", "lokr")
TYPE_KEY = "diffsynth.lora.type"
# ComfyUI patches weights in float32 and adds this to the base weight's row norms before dividing.
DORA_EPS = torch.finfo(torch.float32).eps
LOHA_PARTS = ("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b")
LOKR_PARTS = ("lokr_w1", "lokr_w1_a", "lokr_w1_b", "lokr_w2", "lokr_w2_a", "lokr_w2_b")
DORA_PART = "dora_scale"
# A LyCORIS factor's key in a file or a peft state dict: ``<layer>.<part>[.<adapter>]`` (peft names the adapter).
ADAPTER_KEY = re.compile(r"^(?P<layer>.+?)\.(?P<part>hada_w[12]_[ab]|lokr_w[12](?:_[ab])?|dora_scale)"
                         r"(?:\.(?P<adapter>[^.]+))?$")
# peft's DoRA magnitude ``m`` (not a file key: files hold ComfyUI's ``dora_scale``).
PEFT_MAGNITUDE_KEY = re.compile(r"^(?P<layer>.+?)\.lora_magnitude_vector(?:\.(?P<adapter>[^.]+))?\.weight$")


@dataclass
class LoHaLayer:
    """One LoHa layer: ``delta W = scale * (w1_a @ w1_b) * (w2_a @ w2_b)`` (Linear layers)."""

    w1_a: torch.Tensor
    w1_b: torch.Tensor
    w2_a: torch.Tensor
    w2_b: torch.Tensor
    scale: float = 1.0
    kind = "loha"

    @property
    def rank(self) -> int:
        return self.w1_b.shape[0]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.w1_a.shape[0], self.w1_b.shape[1]

    def factors(self) -> dict[str, torch.Tensor]:
        """The tensors under their file names."""
        return dict(zip(LOHA_PARTS, (self.w1_a, self.w1_b, self.w2_a, self.w2_b)))

    def delta(self, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
              base: torch.Tensor | None = None) -> torch.Tensor:
        """The weight change (``base`` is not needed), computed in ``dtype`` on ``device``."""
        w1_a, w1_b, w2_a, w2_b = (tensor.to(device, dtype) for tensor in (self.w1_a, self.w1_b, self.w2_a, self.w2_b))
        return self.scale * (w1_a @ w1_b) * (w2_a @ w2_b)

    def rescaled(self, factor: float) -> LoHaLayer:
        """The same layer with its change multiplied by ``factor`` (folded into ``w1_a``), at scale 1."""
        return LoHaLayer(self.w1_a.float() * (self.scale * factor), self.w1_b, self.w2_a, self.w2_b, 1.0)


@dataclass
class LoKrLayer:
    """One LoKr layer: ``delta W = scale * kron(w1, w2)``, each factor whole or a product ``a @ b`` of rank r."""

    parts: dict[str, torch.Tensor]
    scale: float = 1.0
    kind = "lokr"

    def factor(self, which: str) -> torch.Tensor:
        whole = self.parts.get(f"lokr_{which}")
        if whole is not None:
            return whole.float()
        return self.parts[f"lokr_{which}_a"].float() @ self.parts[f"lokr_{which}_b"].float()

    @property
    def decomposed(self) -> tuple[bool, bool]:
        return "lokr_w1" not in self.parts, "lokr_w2" not in self.parts

    @property
    def rank(self) -> int | None:
        """The rank ComfyUI divides ``alpha`` by: ``w2``'s when decomposed, else ``w1``'s; None when both are
        whole (ComfyUI then ignores ``alpha``)."""
        if "lokr_w2_b" in self.parts:
            return self.parts["lokr_w2_b"].shape[0]
        if "lokr_w1_b" in self.parts:
            return self.parts["lokr_w1_b"].shape[0]
        return None

    @property
    def shape(self) -> tuple[int, ...]:
        w1, w2 = (self.factor(which).shape for which in ("w1", "w2"))
        return w1[0] * w2[0], w1[1] * w2[1]

    def factors(self) -> dict[str, torch.Tensor]:
        return dict(self.parts)

    def delta(self, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
              base: torch.Tensor | None = None) -> torch.Tensor:
        w1, w2 = (self.factor(which).to(device, dtype) for which in ("w1", "w2"))
        return self.scale * torch.kron(w1, w2)

    def rescaled(self, factor: float) -> LoKrLayer:
        """The same layer with its change multiplied by ``factor`` (folded into ``w1`` or ``w1_a``), at scale 1."""
        key = "lokr_w1" if "lokr_w1" in self.parts else "lokr_w1_a"
        return LoKrLayer({**self.parts, key: self.parts[key].float() * (self.scale * factor)}, 1.0)


def dora_delta(down: torch.Tensor, up: torch.Tensor, scale: float, dora_scale: torch.Tensor, base: torch.Tensor,
               dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> torch.Tensor:
    """A DoRA layer's weight change as ComfyUI computes it: ``d / (||W||_row + eps) * (W + s * up @ down) - W``.

    Raises:
        ValueError: No base weight (a DoRA change depends on it).
    """
    if base is None:
        raise ValueError("a DoRA layer's weight change depends on the base weight; pass base=")
    weight = base.to(device, torch.float32).reshape(up.shape[0], -1)
    lora = scale * (up.to(device, torch.float32).flatten(1) @ down.to(device, torch.float32).flatten(1))
    norm = weight.norm(dim=1, keepdim=True) + DORA_EPS
    changed = dora_scale.to(device, torch.float32).reshape(-1, 1) / norm * (weight + lora)
    return (changed - weight).reshape(up.shape[0], *down.shape[1:]).to(dtype)


def dora_scale_from_magnitude(magnitude: torch.Tensor, lora_change: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """ComfyUI's ``dora_scale`` (1-D) for peft's magnitude ``m``: ``m * (||W||_row + eps) / ||W + change||_row``."""
    weight = base.float().reshape(base.shape[0], -1)
    adapted = weight + lora_change.float().reshape(weight.shape)
    return magnitude.float().flatten() * (weight.norm(dim=1) + DORA_EPS) / adapted.norm(dim=1)


def magnitude_from_dora_scale(dora_scale: torch.Tensor, lora_change: torch.Tensor, base: torch.Tensor
                              ) -> torch.Tensor:
    """peft's magnitude ``m`` for a file's ``dora_scale``: the inverse of :func:`dora_scale_from_magnitude`."""
    weight = base.float().reshape(base.shape[0], -1)
    adapted = weight + lora_change.float().reshape(weight.shape)
    return dora_scale.float().flatten() * adapted.norm(dim=1) / (weight.norm(dim=1) + DORA_EPS)


def adapter_layer(parts: Mapping[str, torch.Tensor], alpha: float | None, where: str) -> LoHaLayer | LoKrLayer:
    """The LoHa or LoKr layer of one layer's file tensors (``hada_*`` or ``lokr_*``), with its ``alpha`` as ComfyUI
    reads it (none: scale 1).

    Raises:
        ValueError: A factor is missing, or the layer mixes LoHa and LoKr factors.
    """
    names = set(parts)
    if names <= set(LOHA_PARTS):
        missing = sorted(set(LOHA_PARTS) - names)
        if missing:
            raise ValueError(f"LoHa layer {where} lacks {missing}; a LoHa layer needs all four hada_ factors")
        layer = LoHaLayer(*(parts[name] for name in LOHA_PARTS))
        layer.scale = 1.0 if alpha is None else alpha / layer.rank
        return layer
    if names <= set(LOKR_PARTS):
        for which in ("w1", "w2"):
            whole, pair = f"lokr_{which}" in names, {f"lokr_{which}_a", f"lokr_{which}_b"} <= names
            if whole == pair:
                raise ValueError(f"LoKr layer {where} needs lokr_{which}, or lokr_{which}_a with lokr_{which}_b "
                                 "(not both, not neither)")
        layer = LoKrLayer(dict(parts))
        rank = layer.rank
        layer.scale = 1.0 if alpha is None or rank is None else alpha / rank
        return layer
    raise ValueError(f"layer {where} mixes factors of several adapter types: {sorted(names)}")


def adapter_type(layers: Mapping[str, object]) -> str:
    """The type a set of layers makes: ``lora``, ``lora+dora``, ``loha`` or ``lokr`` (``mixed`` for several)."""
    kinds = {getattr(layer, "kind", "lora") + ("+dora" if getattr(layer, "dora_scale", None) is not None else "")
             for layer in layers.values()}
    return next(iter(kinds)) if len(kinds) == 1 else ("mixed" if kinds else "lora")
