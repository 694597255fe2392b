"""The Z-Image-Turbo Fun ControlNets (Union, Tile): diffusers' ``ZImageControlNetModel`` beside the transformer.

The ControlNet is the pipeline's ``controlnet`` model (the reference's name, so its ``--trainable_models controlnet``
and ``--remove_prefix_in_ckpt pipe.controlnet.`` work). It is called as ``controlnet_inputs=[ControlNetInput(image=...,
scale=...)]`` (the reference's call) or, in training, from a ``controlnet_image`` column (the reference's
``--extra_inputs controlnet_image``). The computation is diffusers' ``ZImageControlNetPipeline``:

- The control image, resized to the output size (Lanczos), is encoded by the VAE (the distribution's mode,
  normalised), and the channels the ControlNet reads beyond the 16 latent ones (Union 2.1: an inpaint mask and
  inpaint latents) are zeros.
- At every step the ControlNet reads the noisy latents, the timestep, the caption and the control latents, and
  returns one hint per main block it feeds (every second one), scaled by the ControlNet input's ``scale``; the
  transformer adds them after those blocks (``controlnet_block_samples``).

diffusers' ControlNet recomputes the transformer's patch embedding, noise and caption refiners with the
transformer's own modules (``ZImageControlNetModel.from_transformer``). ``from_transformer`` would register them as
the ControlNet's children, so the ControlNet's parameters, state dict and ``--trainable_models controlnet`` would
take in the transformer's; here they are lent as plain attributes instead (``lend_transformer``), and a LoRA on the
transformer acts in the ControlNet's pass too.

Where the reference differs, diffusers is followed: the 2.1 ControlNets' noise-refiner hints steer only the
ControlNet's own pass (the reference and VideoX-Fun add them to the transformer's noise refiner as well), and the
inpaint channels are zeros (the reference fills them with the VAE latents of a black image). Inpainting
(``inpaint_image``, ``inpaint_mask``) is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from PIL import Image

from ...diffusion.base_pipeline import PipelineUnit
from ..common import ControlNetInput

if TYPE_CHECKING:
    from .pipeline import ZImagePipeline

# The transformer's parts diffusers' ControlNet computes with (``ZImageControlNetModel.from_transformer``).
LENT_PARTS = ("t_scale", "t_embedder", "all_x_embedder", "cap_embedder", "rope_embedder", "noise_refiner",
              "context_refiner", "x_pad_token", "cap_pad_token")
CONTROLNET_ENTRY = "PAI/Z-Image-Turbo-Fun-Controlnet-Union-2.1:Z-Image-Turbo-Fun-Controlnet-Union-2.1.safetensors"



def lend_transformer(controlnet: torch.nn.Module, dit: torch.nn.Module) -> None:
    """Gives ``controlnet`` the transformer parts it computes with, as plain attributes: they stay ``dit``'s (not in
    the ControlNet's parameters or state dict), and whatever wraps them in ``dit`` (a LoRA) acts here too."""
    for name in LENT_PARTS:
        object.__setattr__(controlnet, name, getattr(dit, name))


def control_input(controlnet_inputs: Sequence[ControlNetInput] | ControlNetInput | None,
                  controlnet_image: Image.Image | None) -> tuple[Image.Image | None, float]:
    """``(control image, scale)`` from the call's ``controlnet_inputs`` or a training sample's ``controlnet_image``.

    Raises:
        ValueError: More than one input, an input without an image, inpainting inputs, or both spellings at once.
    """
    if controlnet_inputs is None:
        return controlnet_image, 1.0
    if controlnet_image is not None:
        raise ValueError("give the control image once: controlnet_inputs=[ControlNetInput(image=...)] or "
                         "controlnet_image=..., not both")
    inputs = [controlnet_inputs] if isinstance(controlnet_inputs, ControlNetInput) else list(controlnet_inputs)
    if len(inputs) != 1 or not isinstance(inputs[0], ControlNetInput):
        raise ValueError(f"controlnet_inputs={controlnet_inputs!r} must be one ControlNetInput, e.g. "
                         "[ControlNetInput(image=control_image, scale=0.7)]: Z-Image takes one ControlNet")
    given = inputs[0]
    if given.inpaint_image is not None or given.inpaint_mask is not None:
        raise ValueError("ControlNetInput(inpaint_image=..., inpaint_mask=...) is not supported here: the Z-Image Fun "
                         "ControlNet runs from a control image; leave inpaint_image and inpaint_mask unset")
    if (given.controlnet_id, given.start, given.end, given.processor_id) != (0, 1.0, 0.0, None):
        raise ValueError(f"ControlNetInput(controlnet_id={given.controlnet_id}, start={given.start}, end={given.end}, "
                         f"processor_id={given.processor_id!r}) is not supported here: Z-Image loads one ControlNet "
                         "for the whole schedule; leave those fields at their defaults")
    if not isinstance(given.image, Image.Image):
        raise ValueError(f"ControlNetInput(image={given.image!r}) must be a PIL image, e.g. Image.open(path)")
    return given.image, float(given.scale)


class ControlNetConditionUnit(PipelineUnit):
    """Encodes the control image for the Fun ControlNet: ``control_context`` ``(1, control_in_dim, 1, h, w)`` (the
    normalised VAE latents, zeros in the channels beyond) and ``control_scale``; both None without one."""

    def __init__(self) -> None:
        super().__init__(input_params=("controlnet_inputs", "controlnet_image", "height", "width"),
                         output_params=("control_context", "control_scale"), onload_model_names=("vae",))

    def process(self, pipe: ZImagePipeline, controlnet_inputs: Sequence[ControlNetInput] | None,
                controlnet_image: Image.Image | None, height: int, width: int) -> dict:
        image, scale = control_input(controlnet_inputs, controlnet_image)
        if image is None:
            return {"control_context": None, "control_scale": None}
        if pipe.controlnet is None:
            raise ValueError(f"a control image needs the Z-Image Fun ControlNet; add '{CONTROLNET_ENTRY}' (or the "
                             "-8steps or Tile file) to the model configs")
        image = image.convert("RGB")
        if image.size != (width, height):
            image = image.resize((width, height), Image.Resampling.LANCZOS)
        latents = pipe.encode_image(image)
        extra = pipe.controlnet.config.control_in_dim - latents.shape[1]
        context = torch.cat([latents, latents.new_zeros(latents.shape[0], extra, *latents.shape[2:])], dim=1)
        return {"control_context": context.unsqueeze(2), "control_scale": scale}


def controlnet_block_samples(pipe: ZImagePipeline, frames: list[torch.Tensor], t: torch.Tensor,
                             captions: list[torch.Tensor], control_context: torch.Tensor | None,
                             control_scale: float | None) -> dict[int, torch.Tensor] | None:
    """The ControlNet's hints for the transformer's main blocks (``{block: hint}``), or None without a control
    image. ``frames`` and ``captions`` are the transformer's per-sample inputs, ``t`` its ``(B,)`` timestep."""
    if control_context is None:
        return None
    if pipe.controlnet is None:
        raise ValueError(f"control_context needs the Z-Image Fun ControlNet; add '{CONTROLNET_ENTRY}'")
    lend_transformer(pipe.controlnet, pipe.dit)
    context = control_context.to(frames[0].dtype)
    if context.shape[0] != len(frames):
        context = context.expand(len(frames), *context.shape[1:])
    scale = 1.0 if control_scale is None else float(control_scale)
    return pipe.controlnet(frames, t, captions, list(context.unbind(0)), conditioning_scale=scale)

