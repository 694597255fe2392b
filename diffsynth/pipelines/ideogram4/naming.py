"""Ideogram 4's layer names for LoRA files: diffusers' names under ``transformer.``, which diffusers'
``Ideogram4LoraLoaderMixin`` loads as they are (it converts only files in Ideogram's fused ``attention.qkv`` layout)."""

from ...diffusion.module_naming import ModuleNaming

NAMING = ModuleNaming("diffusers Ideogram 4", identity=True, universal_prefix="transformer.")
