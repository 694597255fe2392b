"""Qwen-Image's original release uses diffusers' layer names."""

from ...diffusion.module_naming import ModuleNaming

NAMING = ModuleNaming("original Qwen-Image", identity=True)
