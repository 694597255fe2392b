"""The keyword inputs the Wan pipeline passes its denoiser, on the meta device, for the memory planner's dry run."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .fun_control import CLIP_TOKENS


def planner_inputs(model: nn.Module, height: int, width: int, frames: int, dtype: torch.dtype, batch: int,
                   prompt_tokens: int) -> dict[str, Any]:
    """The denoiser's inputs for a batch of ``batch`` samples of ``height`` x ``width`` (x ``frames``) pixels with
    ``prompt_tokens``-token prompts."""
    config, meta, text = model.config, torch.device("meta"), prompt_tokens
    inputs = dict(hidden_states=torch.empty(batch, config.in_channels, (frames - 1) // 4 + 1, height // 8, width // 8,
                                            dtype=dtype, device=meta),
                  encoder_hidden_states=torch.empty(batch, text, config.text_dim, dtype=dtype, device=meta),
                  timestep=torch.empty(batch, device=meta), return_dict=False)
    latents = inputs["hidden_states"]
    if config.image_dim:  # image-to-video: CLIP image tokens; FLF2V's of two images, each its own sample
        images = 2 if config.get("pos_embed_seq_len") else 1
        inputs["encoder_hidden_states_image"] = torch.empty(images * batch, CLIP_TOKENS, config.image_dim, dtype=dtype,
                                                            device=meta)
    if "vace_layers" in config:  # VACE: the control context, as wide as the video's latents
        inputs["control_hidden_states"] = torch.empty(batch, config.vace_in_channels, *latents.shape[2:], dtype=dtype,
                                                      device=meta)
    if "motion_encoder_size" in config:  # Animate: the character's latent frame, pose latents and face crops
        frames_out = latents.shape[2] - 1
        inputs["pose_hidden_states"] = torch.empty(batch, config.latent_channels, frames_out, *latents.shape[3:],
                                                   dtype=dtype, device=meta)
        size = config.motion_encoder_size
        inputs["face_pixel_values"] = torch.empty(batch, 3, (frames_out - 1) * 4 + 1, size, size, dtype=dtype,
                                                  device=meta)
    # The Fun models' control latents and image condition are part of in_channels; their reference image and camera
    # motion are inputs of their own.
    if config.get("reference_conv"):
        inputs["reference_latents"] = torch.empty(batch, config.out_channels, *latents.shape[3:], dtype=dtype,
                                                  device=meta)
    if config.get("camera_channels"):
        inputs["camera_latents"] = torch.empty(batch, config.camera_channels, latents.shape[2], height, width,
                                               dtype=dtype, device=meta)
    return inputs
