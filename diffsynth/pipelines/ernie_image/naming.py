"""ERNIE-Image's layer names for LoRA files: the released transformer, the reference's ``ErnieImageDiT`` and diffusers'
``ErnieImageTransformer2DModel`` share them; diffusers' ``ErnieImageLoraLoaderMixin`` reads them under
``diffusion_model.``."""

from ...diffusion.module_naming import ModuleNaming

NAMING = ModuleNaming("original ERNIE-Image", identity=True)
