"""The Qwen-Image Blockwise ControlNets (Canny, Depth, Inpaint) on diffusers' ``QwenImageTransformer2DModel``.

The ControlNets are the pipeline's ``blockwise_controlnet`` (``QwenImageBlockwiseMultiControlNet``, the reference's
name and layout: its ``--trainable_models blockwise_controlnet`` and ``--remove_prefix_in_ckpt
pipe.blockwise_controlnet.models.0.`` work). They are called as ``blockwise_controlnet_inputs=[ControlNetInput(
image=..., inpaint_mask=..., scale=...)]`` (the reference's call) or, in training, from the ``blockwise_controlnet_image``
and ``blockwise_controlnet_inpaint_mask`` columns (the reference's ``--extra_inputs``). The computation is the
reference's:

- The control image is encoded by the VAE (the distribution's mode, normalised). With an inpaint mask, the image's
  pixels where the mask is bright (its channel mean above the middle grey) are blacked out first, and the latents get
  one more channel: 1 minus the mask (in ``[0, 1]``), resized to the latent grid by nearest neighbour.
- Once per transformer call each ControlNet embeds its packed control latents (``img_in``); after every transformer
  block ``i`` the residual of control block ``i`` times the input's ``scale`` is added to the generated image's
  tokens (not to edit images' tokens), summed over the inputs.

The residuals are added by a forward hook on each of diffusers' transformer blocks, which reads what the current
``model_fn`` call set on the transformer (``set_block_residuals``): the transformer's own forward and its parameter
names stay diffusers', so a LoRA on it is a plain Qwen-Image LoRA. Without gradients the setting is cleared after the
call; with gradients it stays until the next call, because a checkpointed block recomputes its forward, the hook's
included, during the backward pass.

Not supported: a step window (``start`` / ``end`` other than the whole schedule), ``inpaint_image`` and
``processor_id`` (the Blockwise ControlNets read neither), and a control image of another size than the output is
resized to it (the reference needs them equal).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from PIL import Image

from ...diffusion.base_pipeline import PipelineUnit
from ..common import ControlNetInput, pack_latents

if TYPE_CHECKING:
    from .pipeline import QwenImagePipeline

BLOCKWISE_ENTRY = "DiffSynth-Studio/Qwen-Image-Blockwise-ControlNet-Canny:model.safetensors"
_HOOKED = "_blockwise_hooks"
_RESIDUALS = "_blockwise_residuals"



def blockwise_inputs(blockwise_controlnet_inputs: Sequence[ControlNetInput] | ControlNetInput | None,
                     image: Image.Image | None, inpaint_mask: Image.Image | None) -> list[ControlNetInput]:
    """The call's inputs, or one input (scale 1) from a training sample's ``blockwise_controlnet_image`` and
    ``blockwise_controlnet_inpaint_mask``; checked.

    Raises:
        ValueError: Both spellings at once, a mask without an image, or an input this pipeline cannot run.
    """
    if blockwise_controlnet_inputs is None:
        if image is None and inpaint_mask is not None:
            raise ValueError("blockwise_controlnet_inpaint_mask needs blockwise_controlnet_image (the image to fill); "
                             "add its column to --extra_inputs and --data_file_keys")
        return [] if image is None else [ControlNetInput(image=image, inpaint_mask=inpaint_mask)]
    if image is not None or inpaint_mask is not None:
        raise ValueError("give the control image once: blockwise_controlnet_inputs=[ControlNetInput(image=...)] or "
                         "blockwise_controlnet_image=..., not both")
    inputs = [blockwise_controlnet_inputs] if isinstance(blockwise_controlnet_inputs, ControlNetInput) \
        else list(blockwise_controlnet_inputs)
    for given in inputs:
        _check_input(given)
    return inputs


def _check_input(given: Any) -> None:
    if not isinstance(given, ControlNetInput):
        raise ValueError(f"blockwise_controlnet_inputs holds {given!r}; give ControlNetInput(image=..., scale=...) "
                         "items (from diffsynth.pipelines.qwen_image)")
    if not isinstance(given.image, Image.Image):
        raise ValueError(f"ControlNetInput(image={given.image!r}) must be a PIL image, e.g. Image.open(path)")
    if given.inpaint_mask is not None and not isinstance(given.inpaint_mask, Image.Image):
        raise ValueError(f"ControlNetInput(inpaint_mask={given.inpaint_mask!r}) must be a PIL image or None")
    if (given.start, given.end) != (1.0, 0.0):
        raise ValueError(f"ControlNetInput(start={given.start}, end={given.end}): a step window is not supported "
                         "here; leave start=1.0 and end=0.0 (the whole schedule)")
    if given.inpaint_image is not None or given.processor_id is not None:
        raise ValueError("ControlNetInput(inpaint_image=..., processor_id=...) is not read by the Blockwise "
                         "ControlNets; give the image to fill as image= and its mask as inpaint_mask=")


def _pixels(image: Image.Image) -> torch.Tensor:
    """An image as a ``(1, 3, H, W)`` float32 tensor in ``[-1, 1]``."""
    array = np.asarray(image.convert("RGB"), dtype=np.float32)
    return torch.from_numpy(array).permute(2, 0, 1).unsqueeze(0) * (2 / 255) - 1


def control_latents(pipe: QwenImagePipeline, given: ControlNetInput, height: int, width: int) -> torch.Tensor:
    """The control latents of one input: ``(1, 16, h, w)``, or ``(1, 17, h, w)`` with an inpaint mask."""
    image = given.image.convert("RGB")
    if image.size != (width, height):
        image = image.resize((width, height), Image.Resampling.LANCZOS)
    if given.inpaint_mask is not None:
        # The region to fill is blacked out where the mask (at the image's size) is brighter than middle grey.
        covered = _pixels(given.inpaint_mask.convert("RGB").resize(image.size)).mean(dim=(0, 1)) > 0
        array = np.array(image)
        array[covered.numpy()] = 0
        image = Image.fromarray(array)
    latents = pipe.encode_image(image)
    if given.inpaint_mask is None:
        return latents
    mask = ((_pixels(given.inpaint_mask) + 1) / 2).mean(dim=1, keepdim=True)
    mask = 1 - torch.nn.functional.interpolate(mask, size=latents.shape[-2:])
    return torch.cat([latents, mask.to(latents.device, latents.dtype)], dim=1)


class BlockwiseControlNetUnit(PipelineUnit):
    """Encodes the control images: ``blockwise_controlnet_conditioning``, a list of ``(controlnet_id, scale,
    latents)``, or None without one."""

    def __init__(self) -> None:
        super().__init__(input_params=("blockwise_controlnet_inputs", "blockwise_controlnet_image",
                                       "blockwise_controlnet_inpaint_mask", "height", "width"),
                         output_params=("blockwise_controlnet_conditioning",), onload_model_names=("vae",))

    def process(self, pipe: QwenImagePipeline, blockwise_controlnet_inputs: Sequence[ControlNetInput] | None,
                blockwise_controlnet_image: Image.Image | None, blockwise_controlnet_inpaint_mask: Image.Image | None,
                height: int, width: int) -> dict:
        inputs = blockwise_inputs(blockwise_controlnet_inputs, blockwise_controlnet_image,
                                  blockwise_controlnet_inpaint_mask)
        if not inputs:
            return {"blockwise_controlnet_conditioning": None}
        for given in inputs:
            _check_controlnet(pipe, given)
        return {"blockwise_controlnet_conditioning": [
            (given.controlnet_id, float(given.scale), control_latents(pipe, given, height, width))
            for given in inputs]}


def _check_controlnet(pipe: QwenImagePipeline, given: ControlNetInput) -> None:
    """Raises ValueError unless ``given`` names a loaded ControlNet that reads a mask exactly when it has one."""
    loaded = 0 if pipe.blockwise_controlnet is None else len(pipe.blockwise_controlnet.models)
    if not 0 <= given.controlnet_id < loaded:
        raise ValueError(f"ControlNetInput(controlnet_id={given.controlnet_id}) names a Blockwise ControlNet that is "
                         f"not loaded ({loaded} loaded); add '{BLOCKWISE_ENTRY}' (or -Depth, -Inpaint) to the model "
                         "configs")
    reads_mask = pipe.blockwise_controlnet.models[given.controlnet_id].config.additional_in_dim > 0
    if reads_mask != (given.inpaint_mask is not None):
        raise ValueError(f"ControlNetInput(inpaint_mask={'set' if given.inpaint_mask else None}) for Blockwise "
                         f"ControlNet {given.controlnet_id}, which {'reads' if reads_mask else 'reads no'} mask: the "
                         "Inpaint ControlNet needs inpaint_mask= (blockwise_controlnet_inpaint_mask), Canny and Depth "
                         "take none")


class BlockResiduals:
    """What the hooks add in one transformer call: each input's ControlNet, scale and embedded control tokens.

    Args:
        controlnets: The loaded ControlNets (``blockwise_controlnet.models``).
        conditioning: ``(controlnet_id, scale, latents)`` per input (the unit's output).
        batch: The call's batch size.
        tokens: How many leading image tokens are the generated image's.
    """

    def __init__(self, controlnets: torch.nn.ModuleList, conditioning: Sequence[tuple[int, float, torch.Tensor]],
                 batch: int, tokens: int) -> None:
        self.tokens = tokens
        self.inputs = []
        for controlnet_id, scale, latents in conditioning:
            model = controlnets[controlnet_id]
            packed = pack_latents(latents.to(model.img_in.weight.dtype)).expand(batch, -1, -1)
            self.inputs.append((model, scale, model.embed_condition(packed)))

    def add(self, block: int, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` after transformer block ``block``, with the residuals added to its first ``tokens`` tokens."""
        image = hidden[:, :self.tokens]
        residual = 0
        for model, scale, condition in self.inputs:
            residual = residual + model.block_residual(image, condition, block) * scale
        return torch.cat([image + residual, hidden[:, self.tokens:]], dim=1)


def set_block_residuals(dit: torch.nn.Module, residuals: BlockResiduals | None) -> None:
    """Makes the transformer's blocks add ``residuals`` from now on (None: nothing), hooking them on first use."""
    if residuals is not None and getattr(dit, _HOOKED, None) is None:
        owner = weakref.ref(dit)  # the hooks live in the blocks; a weak reference keeps them from holding dit alive
        handles = [block.register_forward_hook(_hook(owner, index))
                   for index, block in enumerate(dit.transformer_blocks)]
        object.__setattr__(dit, _HOOKED, handles)
    object.__setattr__(dit, _RESIDUALS, residuals)


def _hook(owner: weakref.ref, index: int) -> Any:
    def add_residual(module: torch.nn.Module, args: Any, output: tuple[torch.Tensor, torch.Tensor]) -> Any:
        residuals = getattr(owner(), _RESIDUALS, None)
        if residuals is None:
            return None
        encoder_hidden_states, hidden_states = output
        return encoder_hidden_states, residuals.add(index, hidden_states)

    return add_residual
