"""The Qwen-Image Blockwise ControlNet (``DiffSynth-Studio/Qwen-Image-Blockwise-ControlNet-Canny``, ``-Depth``,
``-Inpaint``): a model diffusers lacks, written here on diffusers' ``ModelMixin`` so that it loads, saves and trains
like the other models.

Its parameter names are the release file's (``img_in.*``, ``controlnet_blocks.<i>.{x_rms,y_rms,input_proj,
output_proj}.*``), so the file loads as it is. It has no forward of its own: ``img_in`` turns the packed control
latents into the transformer's width once per call (``embed_condition``), and after each transformer block ``i`` the
control block ``i`` reads the block's image tokens and that embedding and returns a residual (``block_residual``):
``output_proj(gelu(input_proj(rms(x) + rms(y))))``. ``blockwise.py`` adds the residuals to diffusers'
``QwenImageTransformer2DModel``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from diffusers.models.normalization import RMSNorm
from torch import nn


class BlockwiseControlBlock(nn.Module):
    """One control block: the residual for one transformer block.

    Args:
        dim: The transformer's width (heads x head size).
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.x_rms = RMSNorm(dim, eps=1e-6)
        self.y_rms = RMSNorm(dim, eps=1e-6)
        self.input_proj = nn.Linear(dim, dim)
        self.act = nn.GELU()
        self.output_proj = nn.Linear(dim, dim)

    def forward(self, image: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        """``(B, N, dim)`` image tokens and ``(B, N, dim)`` embedded control -> the ``(B, N, dim)`` residual."""
        return self.output_proj(self.act(self.input_proj(self.x_rms(image) + self.y_rms(condition))))


class QwenImageBlockwiseControlNet(ModelMixin, ConfigMixin):
    """The Blockwise ControlNet: a control embedding and one control block per transformer block.

    Args:
        num_layers: Transformer blocks it feeds (60 for Qwen-Image).
        in_dim: Channels of a packed latent token (16 latent channels x a 2x2 patch).
        additional_in_dim: Extra packed channels (Inpaint: 4, its mask's 2x2 patch).
        dim: The transformer's width.
    """

    @register_to_config
    def __init__(self, num_layers: int = 60, in_dim: int = 64, additional_in_dim: int = 0, dim: int = 3072) -> None:
        super().__init__()
        self.img_in = nn.Linear(in_dim + additional_in_dim, dim)
        self.controlnet_blocks = nn.ModuleList([BlockwiseControlBlock(dim) for _ in range(num_layers)])

    def zero_initialise(self) -> None:
        """Zeros the embedding and every block's output projection (the reference's ``init_weight``): a ControlNet
        started this way adds nothing until it trains."""
        for layer in (self.img_in, *(block.output_proj for block in self.controlnet_blocks)):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def embed_condition(self, condition: torch.Tensor) -> torch.Tensor:
        """Packed control tokens ``(B, N, in_dim + additional_in_dim)`` -> ``(B, N, dim)``."""
        return self.img_in(condition)

    def block_residual(self, image: torch.Tensor, condition: torch.Tensor, block: int) -> torch.Tensor:
        """The residual control block ``block`` adds to the image tokens after transformer block ``block``."""
        return self.controlnet_blocks[block](image, condition)


class QwenImageBlockwiseMultiControlNet(nn.Module):
    """The pipeline's ``blockwise_controlnet``: the loaded Blockwise ControlNets, ``models.<controlnet_id>``, as the
    reference holds them (so its ``--remove_prefix_in_ckpt pipe.blockwise_controlnet.models.0.`` leaves the release
    file's names).

    Args:
        models: The ControlNets, in load order.
    """

    def __init__(self, models: list[QwenImageBlockwiseControlNet]) -> None:
        super().__init__()
        self.models = nn.ModuleList(models)


def write_initial_controlnet(path: str | Path, torch_dtype: torch.dtype = torch.bfloat16, **config: int) -> Path:
    """Writes a zero-initialised Blockwise ControlNet (``zero_initialise``) to ``path``, in the release's layout, to
    train one from scratch (``--model_paths``); the reference's initialisation scripts.

    Args:
        path: The safetensors file to write; its folder is created.
        torch_dtype: The weights' dtype.
        config: ``QwenImageBlockwiseControlNet`` arguments; by default Qwen-Image's sizes (Inpaint:
            ``additional_in_dim=4``).
    """
    from safetensors.torch import save_file

    with torch.device("cpu"):
        controlnet = QwenImageBlockwiseControlNet(**config).to(torch_dtype)
    controlnet.zero_initialise()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({key: value.contiguous() for key, value in controlnet.state_dict().items()}, str(path))
    return path
