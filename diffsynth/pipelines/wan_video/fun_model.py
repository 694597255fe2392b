"""The Wan Fun transformer: diffusers' ``WanTransformer3DModel`` plus the two modules of the PAI Fun releases that it
lacks, under the releases' own names so their tensors load as they are.

- ``ref_conv`` (Fun-V1.1 Control, Wan2.2-Fun-A14B-Control): a 2x2 convolution that turns the latents of a reference
  image into one extra frame of tokens, put before the video's tokens (RoPE frame 0, the video on frames 1..F) and
  dropped from the output.
- ``control_adapter`` (the Control-Camera models): pixel-unshuffles a camera's Plücker embedding by 8, patches it
  like the latents and adds it, through a residual block, to the patch embedding of the latents.

Both ride on the parent's own forward: a reference image adds an empty first frame to the input (so the RoPE table
and the token grid have ``F + 1`` frames), and a hook on ``patch_embedding`` puts the reference tokens into that frame
and adds the camera features to the others. Everything else (blocks, conditioning, LoRA names) is diffusers'.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import WanTransformer3DModel
from diffusers.configuration_utils import register_to_config
from torch import nn

from .original import CAMERA_UNSHUFFLE


class CameraAdapter(nn.Module):
    """The Control-Camera adapter: pixel unshuffle by 8, a patch convolution, one residual block of 3x3 convolutions.

    Args:
        in_channels: Channels of the folded Plücker embedding (24).
        dim: The transformer's width.
        patch: The transformer's spatial patch size.
    """

    def __init__(self, in_channels: int, dim: int, patch: tuple[int, int]) -> None:
        super().__init__()
        self.pixel_unshuffle = nn.PixelUnshuffle(CAMERA_UNSHUFFLE)
        self.conv = nn.Conv2d(in_channels * CAMERA_UNSHUFFLE**2, dim, kernel_size=patch, stride=patch)
        self.residual_blocks = nn.Sequential(_ResidualBlock(dim))

    def forward(self, camera: torch.Tensor) -> torch.Tensor:
        """``(B, 24, F, H, W)`` camera features at pixel resolution -> ``(B, dim, F, H / 16, W / 16)``."""
        batch, channels, frames, height, width = camera.shape
        per_frame = camera.transpose(1, 2).reshape(batch * frames, channels, height, width)
        features = self.residual_blocks(self.conv(self.pixel_unshuffle(per_frame)))
        return features.reshape(batch, frames, *features.shape[1:]).transpose(1, 2)


class _ResidualBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(dim, dim, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(dim, dim, kernel_size=3, padding=1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + self.conv2(torch.relu(self.conv1(hidden)))


class WanFunTransformer3DModel(WanTransformer3DModel):
    """``WanTransformer3DModel`` with the Fun releases' reference-image convolution and camera adapter.

    Args:
        reference_conv: Build ``ref_conv`` (Fun-V1.1 Control, Wan2.2-Fun-A14B-Control).
        camera_channels: Channels of the camera adapter's input (24), or None for no adapter.
        Others: as ``WanTransformer3DModel``.
    """

    @register_to_config
    def __init__(self, patch_size: tuple[int, ...] = (1, 2, 2), num_attention_heads: int = 40,
                 attention_head_dim: int = 128, in_channels: int = 48, out_channels: int = 16, text_dim: int = 4096,
                 freq_dim: int = 256, ffn_dim: int = 13824, num_layers: int = 40, cross_attn_norm: bool = True,
                 qk_norm: str | None = "rms_norm_across_heads", eps: float = 1e-6, image_dim: int | None = None,
                 added_kv_proj_dim: int | None = None, rope_max_seq_len: int = 1024,
                 pos_embed_seq_len: int | None = None, reference_conv: bool = False,
                 camera_channels: int | None = None) -> None:
        super().__init__(patch_size=patch_size, num_attention_heads=num_attention_heads,
                         attention_head_dim=attention_head_dim, in_channels=in_channels, out_channels=out_channels,
                         text_dim=text_dim, freq_dim=freq_dim, ffn_dim=ffn_dim, num_layers=num_layers,
                         cross_attn_norm=cross_attn_norm, qk_norm=qk_norm, eps=eps, image_dim=image_dim,
                         added_kv_proj_dim=added_kv_proj_dim, rope_max_seq_len=rope_max_seq_len,
                         pos_embed_seq_len=pos_embed_seq_len)
        dim = num_attention_heads * attention_head_dim
        patch = tuple(patch_size[1:])
        # The reference latents have the VAE's 16 channels, whatever the transformer's input width.
        self.ref_conv = nn.Conv2d(out_channels, dim, kernel_size=patch, stride=patch) if reference_conv else None
        self.control_adapter = CameraAdapter(camera_channels, dim, patch) if camera_channels else None

    def forward(self, hidden_states: torch.Tensor, timestep: torch.Tensor, encoder_hidden_states: torch.Tensor,
                encoder_hidden_states_image: torch.Tensor | None = None, return_dict: bool = True,
                attention_kwargs: dict[str, Any] | None = None, reference_latents: torch.Tensor | None = None,
                camera_latents: torch.Tensor | None = None) -> Any:
        """As ``WanTransformer3DModel.forward``, with the Fun inputs.

        Args:
            reference_latents: ``(B, 16, H, W)`` or ``(B, 16, 1, H, W)`` normalised latents of the reference image;
                needs ``ref_conv``.
            camera_latents: ``(B, 24, F, 8 H, 8 W)`` folded Plücker embedding (``camera.camera_latents``); needs the
                camera adapter.

        Raises:
            ValueError: An input is given that this transformer has no module for.
        """
        if reference_latents is not None and self.ref_conv is None:
            raise ValueError("reference_latents were given, but this transformer has no ref_conv (a Fun-V1.1 Control "
                             "model has one); drop reference_image")
        if camera_latents is not None and self.control_adapter is None:
            raise ValueError("camera latents were given, but this transformer has no camera adapter (a Control-Camera "
                             "model has one); drop camera_control_direction")
        if reference_latents is None and camera_latents is None:
            return super().forward(hidden_states, timestep, encoder_hidden_states, encoder_hidden_states_image,
                                   return_dict=return_dict, attention_kwargs=attention_kwargs)
        if reference_latents is not None:
            reference_latents = reference_latents[:, :, 0] if reference_latents.ndim == 5 else reference_latents
            empty = hidden_states.new_zeros(*hidden_states.shape[:2], 1, *hidden_states.shape[3:])
            hidden_states = torch.cat([empty, hidden_states], dim=2)

        def add_conditions(module: nn.Module, inputs: Any, patches: torch.Tensor) -> torch.Tensor:
            if camera_latents is not None:
                camera = self.control_adapter(camera_latents.to(patches.dtype))
                start = 0 if reference_latents is None else 1
                patches = torch.cat([patches[:, :, :start], patches[:, :, start:] + camera], dim=2)
            if reference_latents is not None:
                reference = self.ref_conv(reference_latents.to(patches.dtype)).unsqueeze(2)
                patches = torch.cat([reference, patches[:, :, 1:]], dim=2)
            return patches

        handle = self.patch_embedding.register_forward_hook(add_conditions)
        try:
            output = super().forward(hidden_states, timestep, encoder_hidden_states, encoder_hidden_states_image,
                                     return_dict=False, attention_kwargs=attention_kwargs)[0]
        finally:
            handle.remove()
        if reference_latents is not None:
            output = output[:, :, 1:]
        return (output,) if not return_dict else _output(output)


def _output(sample: torch.Tensor) -> Any:
    from diffusers.models.modeling_outputs import Transformer2DModelOutput

    return Transformer2DModelOutput(sample=sample)
