"""diffsynth: low-VRAM fine-tuning of large diffusion models."""

__version__ = "0.1.0"
