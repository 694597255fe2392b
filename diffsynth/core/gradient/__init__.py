"""Gradient (activation) checkpointing."""

from .gradient_checkpoint import gradient_checkpoint_forward

__all__ = ["gradient_checkpoint_forward"]
