"""Masked loss (``--masked_loss``): a per-row grayscale mask weights the loss of each latent element.

A row's ``mask`` file (white: learn, black: ignore, gray: in between) is loaded by the dataset like any file column,
with the same resize and crop as its image or video, so it covers the same pixels. It then travels in the training
state under ``loss_mask``:

1. ``pixel_mask``: the decoded mask as a ``(frames, height, width)`` float tensor in ``[0, 1]`` (one frame for an
   image, or for one image that masks every frame of a video); the training module puts it in the initial state.
2. ``latent_grid_mask``: once the units have encoded the latents, the mask is averaged over the pixels each latent
   cell covers (area downsampling to the latents' height and width), and over the frames each latent frame encodes
   (a causal video VAE such as Wan's keeps the first frame alone and packs each following group of ``s`` frames into
   one latent frame: latent frame 0 is frame 0, latent frame ``i`` averages frames ``(i-1)*s+1 .. i*s``; ``s`` is read
   from the shapes). The result has the latents' shape with one channel, so it batches like them and a stage-1 cache
   holds it at that small size (split training: stage 2 applies the cached mask as it is).
3. ``LossMask.weights``: each element's weight ``W + (1 - W) * mask`` (``--unmasked_weight W``), computed as
   ``1 - (1 - W) * (1 - mask)`` so that a white cell, or ``W = 1``, weighs exactly 1.

The loss multiplies each squared error by its weight and takes the plain mean over all elements (``sum / numel``,
not ``sum / sum of weights``): an all-white mask gives exactly the unmasked loss, an all-black one with ``W = 0``
gives loss 0 and zero gradient, never a division by zero, and a small mask learns in proportion to its area.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

from ..config.masked_loss import MASK_COLUMN

__all__ = ["LOSS_MASK_KEY", "MASK_COLUMN", "LossMask", "latent_grid_mask", "pixel_mask", "with_latent_grid_mask"]

#: The training-state key of the mask (``shared`` scope).
LOSS_MASK_KEY = "loss_mask"


def pixel_mask(mask: Image.Image | Sequence[Image.Image] | None) -> torch.Tensor | None:
    """A decoded mask (an image, or a video's frames) as ``(frames, height, width)`` float32 in ``[0, 1]``.

    Colour is reduced to its luma (PIL's ``L``), so a gray level ``g`` gives ``g / 255``; None (a row without a
    mask) gives None.
    """
    if mask is None:
        return None
    frames = list(mask) if isinstance(mask, (list, tuple)) else [mask]
    return torch.from_numpy(np.stack([np.asarray(frame.convert("L"), dtype=np.float32) / 255.0 for frame in frames]))


def latent_grid_mask(mask: torch.Tensor | None, latents: torch.Tensor) -> torch.Tensor:
    """A mask on the grid of ``latents``: ``(1, 1, *latents.shape[2:])``, float32 (see the module docstring).

    Args:
        mask: A ``pixel_mask``; one already on the latent grid (from a stage-1 cache), returned as it is; or None,
            which gives all ones (the row trains unmasked).
        latents: One sample's ``input_latents``, ``(1, C, H, W)`` or ``(1, C, T, H, W)``.

    Raises:
        ValueError: The mask's frames cannot map onto the latent frames.
    """
    grid = (1, 1, *latents.shape[2:])
    if mask is None:
        return torch.ones(grid, dtype=torch.float32, device=latents.device)
    if mask.dim() == latents.dim():
        if tuple(mask.shape) != grid:
            raise ValueError(f"the cached loss mask has shape {tuple(mask.shape)}, but the latents need {grid}; "
                             "rerun stage 1 (--task sft:data_process) with --masked_loss")
        return mask
    if mask.dim() != 3:
        raise ValueError(f"a loss mask is (frames, height, width); got shape {tuple(mask.shape)}")
    mask = mask.to(latents.device, torch.float32)
    cells = torch.nn.functional.interpolate(mask[:, None], size=tuple(latents.shape[-2:]), mode="area")[:, 0]
    if latents.dim() == 4:
        if cells.shape[0] != 1:
            raise ValueError(f"a mask of {cells.shape[0]} frames for an image: give an image's row one mask image")
        return cells[None]
    return _latent_frames(cells, latents.shape[2])[None, None]


def _latent_frames(cells: torch.Tensor, latent_frames: int) -> torch.Tensor:
    """``(frames, h, w)`` mapped to ``(latent_frames, h, w)`` as a causal video VAE groups frames."""
    frames = cells.shape[0]
    if frames == 1:
        return cells.expand(latent_frames, -1, -1)
    stride = (frames - 1) / max(latent_frames - 1, 1)
    if latent_frames == 1 or stride != int(stride):
        raise ValueError(f"a mask of {frames} frames does not map onto {latent_frames} latent frames (the video "
                         "VAE keeps the first frame and packs each later group of frames into one); give the mask as "
                         "many frames as its video, or one image for all of them")
    stride = int(stride)
    groups = [cells[:1]] + [cells[1 + index * stride:1 + (index + 1) * stride].mean(0, keepdim=True)
                            for index in range(latent_frames - 1)]
    return torch.cat(groups)


def with_latent_grid_mask(state: tuple[dict, dict, dict]) -> tuple[dict, dict, dict]:
    """A sample's state with its ``loss_mask`` brought to the grid of its ``input_latents`` (all ones for a row
    without a mask); unchanged while the latents are not computed yet (a stage 1 that leaves the VAE to stage 2)."""
    shared = state[0]
    latents = shared.get("input_latents")
    if not isinstance(latents, torch.Tensor):
        return state
    return {**shared, LOSS_MASK_KEY: latent_grid_mask(shared.get(LOSS_MASK_KEY), latents)}, state[1], state[2]


@dataclasses.dataclass(frozen=True)
class LossMask:
    """How a loss weighs the masked part of each sample.

    Attributes:
        unmasked_weight: The weight of black mask pixels (``--unmasked_weight``); 0 ignores them, 1 weighs them like
            white ones (no masking).
    """

    unmasked_weight: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.unmasked_weight) and 0.0 <= self.unmasked_weight <= 1.0):
            raise ValueError(f"unmasked_weight={self.unmasked_weight} must lie in [0, 1]")

    def weights(self, inputs_shared: dict, like: torch.Tensor) -> torch.Tensor:
        """The per-element weights of a batch, broadcastable to ``like`` (the latents): ``(B, 1, ...)``.

        Raises:
            ValueError: The state holds no latent-grid mask of the latents' shape.
        """
        mask = inputs_shared.get(LOSS_MASK_KEY)
        expected = (like.shape[0], 1, *like.shape[2:])
        if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != expected:
            found = tuple(mask.shape) if isinstance(mask, torch.Tensor) else mask
            raise ValueError(f"--masked_loss: the training state's {LOSS_MASK_KEY!r} is {found}, not a mask of shape "
                             f"{expected}; a stage-1 cache must be made with --masked_loss too")
        return 1.0 - (1.0 - self.unmasked_weight) * (1.0 - mask.to(like.device, torch.float32))
