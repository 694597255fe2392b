"""FLUX.1's layer names for LoRA files: diffusers' names under ``transformer.``, and BFL's fused layout for kohya files."""

from ...diffusion.module_naming import FusedLayer, FusedNaming, ModuleNaming
from .original import bfl_linear_layers

# BFL's FLUX.1 (black-forest-labs/flux src/flux/model.py), which ComfyUI runs, and the lora_unet_ names that kohya's
# sd-scripts, the reference's --align_to_opensource_format, ComfyUI, DiffSynth-Studio and musubi-tuner use: the
# single-file loader's table of its Linear layers.
BFL_NAMING = FusedNaming("BFL FLUX.1", {
    native: FusedLayer(parts, widths, swapped_halves=swapped)
    for native, (parts, widths, swapped) in bfl_linear_layers().items()
})

# FLUX.1 files keep diffusers' names under transformer.: diffusers' FluxLoraLoaderMixin loads only keys under it,
# ComfyUI's Flux key map takes them (to_q/to_k/to_v as slices of BFL's fused layers), and so does
# DiffSynth-Studio's FluxLoRALoader (fusing them into its own). kohya files use BFL's fused layers.
NAMING = ModuleNaming("diffusers FLUX.1", identity=True, universal_prefix="transformer.", fused=BFL_NAMING)
