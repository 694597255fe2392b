"""Stable Diffusion's layer names for LoRA files.

kohya's sd-scripts trains SD 1.x on diffusers' UNet, so its files name the UNet's layers as diffusers does, underscored
after ``lora_unet_`` (``lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q``): the names diffusers'
``StableDiffusionPipeline.load_lora_weights`` and ComfyUI's SD key map (``unet_to_diffusers``) read.
"""

from ...diffusion.module_naming import ModuleNaming

NAMING = ModuleNaming("kohya Stable Diffusion", identity=True, kohya_only=True)
