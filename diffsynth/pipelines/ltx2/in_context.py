"""LTX-2 IC-LoRA: reference videos given in context, as diffusers' ``LTX2InContextPipeline`` and the reference trainer
condition on them.

Each reference video (``in_context_videos``: a list of videos, each a list of frames) is cut to the clip's
``num_frames``, padded at its end with black frames to a count the video VAE takes (``8k + 1``), resized to the clip's
size divided by ``in_context_downsample_factor`` and encoded (the VAE's mode, normalised) into clean tokens. They are
not part of the state's ``latents``: ``model_fn`` appends them after the video tokens at timestep 0, with positions
whose height and width are scaled back up by the factor (so a half-size reference lines up with the full-size
video), and drops the transformer's output for them. So the scheduler never moves them, and a training loss, which
compares ``latents``, leaves them out.

Noise with references is drawn as ``LTX2InContextPipeline`` draws it: the video tokens and the reference tokens as one
packed ``(1, tokens, C)`` tensor (the references' part unused), then the audio as packed ``(1, L, C_a * M)``; its
schedule is shifted by the video and reference token count together.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from PIL import Image

from ...diffusion.base_pipeline import PipelineUnit
from ..common import video_to_tensor
from .units import pack_video, round_frames

if TYPE_CHECKING:
    from .pipeline import LTX2AudioVideoPipeline

# The reference's default: references at half the video's height and width.
DEFAULT_DOWNSAMPLE_FACTOR = 2


def as_video_list(in_context_videos: Any) -> list[list[Image.Image]] | None:
    """``in_context_videos`` as a list of videos: one video (a list of frames, as a dataset cell naming one file
    loads) becomes a list holding it. None or an empty list: None.

    Raises:
        ValueError: It is not a video or a list of videos (a path left unloaded, a single image).
    """
    if in_context_videos is None or (isinstance(in_context_videos, list) and not in_context_videos):
        return None
    if isinstance(in_context_videos, list) and all(isinstance(frame, Image.Image) for frame in in_context_videos):
        return [in_context_videos]
    if (isinstance(in_context_videos, list)
            and all(isinstance(video, list) and video and all(isinstance(frame, Image.Image) for frame in video)
                    for video in in_context_videos)):
        return in_context_videos
    unloaded = isinstance(in_context_videos, str) or (
        isinstance(in_context_videos, list) and any(isinstance(video, str) for video in in_context_videos))
    if unloaded:
        raise ValueError(f"in_context_videos holds the path {in_context_videos!r}, not a loaded video; add "
                         "in_context_videos to --data_file_keys (e.g. --data_file_keys video,in_context_videos)")
    raise ValueError(f"in_context_videos is {type(in_context_videos).__name__}; pass a list of reference videos, "
                     "each a list of PIL frames: in_context_videos=[frames]")


def downsample_factor(pipe: LTX2AudioVideoPipeline, factor: Any, height: int, width: int) -> int:
    """The checked ``in_context_downsample_factor``: a positive whole number that divides the clip's height and width
    into a whole number of latent pixels (a dataset's cell may hold it as text, e.g. ``"2"``).

    Raises:
        ValueError: It is not such a number.
    """
    try:
        value = int(factor)
        whole = value == float(factor) and not isinstance(factor, bool)
    except (TypeError, ValueError):
        value, whole = 0, False
    unit = pipe.spatial_compression() * (pipe.dit.config.patch_size if pipe.dit is not None else 1)
    if not whole or value < 1 or (height // value) % unit or (width // value) % unit or height % value or width % value:
        raise ValueError(f"in_context_downsample_factor={factor!r} does not fit a {width}x{height} clip: the reference "
                         f"videos are made {width}/factor x {height}/factor pixels, which must be whole multiples of "
                         f"{unit}; use a factor such as 1 or {DEFAULT_DOWNSAMPLE_FACTOR} that divides both sides")
    return value


def reference_grid(pipe: LTX2AudioVideoPipeline, frame_count: int, height: int, width: int, num_frames: int,
                   factor: int) -> tuple[int, int, int]:
    """The latent grid ``(F, H, W)`` of one reference of ``frame_count`` frames for a clip of that size and factor."""
    frames = round_frames(min(frame_count, num_frames) + pipe.temporal_compression() - 1, pipe.temporal_compression())
    return pipe.latent_grid(height // factor, width // factor, min(frames, num_frames))


def reference_token_count(pipe: LTX2AudioVideoPipeline, in_context_videos: Any, height: int, width: int,
                          num_frames: int, factor: Any) -> int:
    """How many tokens the reference videos add (0 without any), checking them first; see ``InContextVideoUnit``."""
    videos = as_video_list(in_context_videos)
    if videos is None:
        return 0
    factor = downsample_factor(pipe, factor, height, width)
    return sum(f * h * w for f, h, w in (reference_grid(pipe, len(video), height, width, num_frames, factor)
                                         for video in videos))


class InContextVideoUnit(PipelineUnit):
    """Encodes ``in_context_videos`` into clean tokens ``in_context_latents`` ``(1, R, C)`` and their latent grids
    ``in_context_grids``; see the module docstring."""

    def __init__(self) -> None:
        super().__init__(input_params=("in_context_videos", "in_context_downsample_factor", "height", "width",
                                       "num_frames"),
                         output_params=("in_context_latents", "in_context_grids", "in_context_downsample_factor"),
                         onload_model_names=("vae",))

    def process(self, pipe: LTX2AudioVideoPipeline, in_context_videos: Any, in_context_downsample_factor: Any,
                height: int, width: int, num_frames: int) -> dict:
        videos = as_video_list(in_context_videos)
        if videos is None:
            return {}
        factor = downsample_factor(pipe, DEFAULT_DOWNSAMPLE_FACTOR if in_context_downsample_factor is None
                                   else in_context_downsample_factor, height, width)
        size = (width // factor, height // factor)
        tokens, grids = [], []
        for video in videos:
            grid = reference_grid(pipe, len(video), height, width, num_frames, factor)
            count = (grid[0] - 1) * pipe.temporal_compression() + 1
            frames = [frame.convert("RGB") for frame in video[:count]]
            frames = [frame if frame.size == size else frame.resize(size, Image.Resampling.LANCZOS)
                      for frame in frames]
            # The reference's padding: black frames at the end up to a count the VAE takes.
            frames += [Image.new("RGB", size)] * (count - len(frames))
            latents = pipe.vae.encode(video_to_tensor(frames).to(pipe.device, pipe.vae.dtype)).latent_dist.mode()
            tokens.append(pack_video(pipe.normalise_video(latents)))
            grids.append(grid)
        return {"in_context_latents": torch.cat(tokens, dim=1).to(pipe.torch_dtype), "in_context_grids": tuple(grids),
                "in_context_downsample_factor": factor}


def append_references(dit: torch.nn.Module, video: torch.Tensor, video_timestep: torch.Tensor,
                      video_coords: torch.Tensor, in_context_latents: torch.Tensor,
                      in_context_grids: Sequence[Sequence[int]], factor: int, frame_rate: float
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The transformer's video input with the reference tokens appended: the tokens, per-token timesteps (0 on the
    references) and positions (the references' height and width scaled by ``factor``)."""
    batch, tokens, device = video.shape[0], video.shape[1], video.device
    references = in_context_latents.to(device, video.dtype)
    if references.shape[0] != batch:
        references = references.expand(batch, -1, -1)
    coords = []
    for frames, height, width in in_context_grids:
        grid = dit.rope.prepare_video_coords(batch, frames, height, width, device, fps=frame_rate)
        grid[:, 1:3] = grid[:, 1:3] * factor
        coords.append(grid)
    if video_timestep.ndim == 1:
        video_timestep = video_timestep[:, None].expand(batch, tokens)
    timestep = torch.cat([video_timestep, video_timestep.new_zeros(batch, references.shape[1])], dim=1)
    return (torch.cat([video, references], dim=1), timestep,
            torch.cat([video_coords, *(grid.to(video_coords) for grid in coords)], dim=2))
