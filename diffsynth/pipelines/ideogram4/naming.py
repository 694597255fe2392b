"""Ideogram 4's layer names for LoRA files: diffusers' names under ``diffusion_model.`` (the universal layout), with a
``.diffusers.safetensors`` twin under ``transformer.`` that diffusers' ``Ideogram4LoraLoaderMixin`` loads as it is.

Not yet the reference's own names: Ideogram's transformer (DiffSynth-Studio's ``Ideogram4DiT``) fuses ``to_q``,
``to_k``, ``to_v`` into ``attention.qkv`` and names ``to_out.0`` ``attention.o``; writing those needs a fused naming
(``FusedNaming``, as FLUX.1's kohya files) and is left for the release reader (docs/en/Ideogram4.md)."""

from ...diffusion.module_naming import ModuleNaming

NAMING = ModuleNaming("diffusers Ideogram 4", identity=True)
