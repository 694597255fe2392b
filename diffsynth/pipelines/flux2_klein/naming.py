"""FLUX.2's layer names for LoRA files ([klein] and [dev] alike).

DiffSynth-Studio's Flux2DiT keeps diffusers' module names. ComfyUI runs BFL's fused layout, and its Flux key map
(comfy/lora.py with comfy/utils.flux_to_diffusers) takes diffusers names bare or under transformer., landing
to_q/to_k/to_v on slices of the fused qkv, but never under diffusion_model.: so the names are written bare.
"""

from ...diffusion.module_naming import ModuleNaming

NAMING = ModuleNaming("DiffSynth-Studio FLUX.2", identity=True, universal_prefix="")
