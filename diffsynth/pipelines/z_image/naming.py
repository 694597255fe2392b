"""Z-Image's layer names for LoRA files.

The released Z-Image transformers (and DiffSynth-Studio's ZImageDiT) use diffusers' names. ComfyUI's NextDiT fuses
attention.qkv and renames to_out.0 to attention.out, but its Lumina2 LoRA key map (comfy/lora.py with
comfy/utils.z_image_to_diffusers) takes diffusers' names and lands to_q/to_k/to_v on slices of qkv.
"""

from ...diffusion.module_naming import ModuleNaming

NAMING = ModuleNaming("original Z-Image", identity=True)
