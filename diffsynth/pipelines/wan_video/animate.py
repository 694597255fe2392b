"""Wan2.2-Animate: the inputs ``WanAnimateTransformer3DModel`` reads, as diffusers' ``WanAnimatePipeline`` builds
them for one segment.

The call takes the reference trainer's names:

- ``input_image``: the character. Its CLIP features go to the image cross-attention; it is fitted into the frame
  (black bars) and its latents, under a 4-channel mask of ones, are the first latent frame of ``y``.
- ``animate_pose_video``: the driving pose frames, encoded by the VAE into ``pose_latents`` (added to the patch
  embedding of every latent frame after the first).
- ``animate_face_video``: the driving face crops, resized to the motion encoder's size (512 in the release) and
  given in pixels (``face_pixel_values``); the negative CFG branch sees them blank (all -1), as diffusers does.
- Replacement mode: ``animate_inpaint_video`` (the background, diffusers' ``background_video``) and
  ``animate_mask_video`` (white where the character goes, diffusers' ``mask_video``). Without them (animation mode) the
  rest of ``y`` is the latents of black frames under a zero mask.

As in the reference, ``num_frames`` counts the reference frame's latent slot too: the video has ``num_frames - 4``
frames (the reference passes 81 and 77-frame control videos; diffusers calls that ``segment_frame_length=77``), the
control videos give their first ``num_frames - 4`` frames, and the first latent frame is dropped before decoding. In
training, the reference cuts the control videos the same way and the target is the whole clip's latents.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from PIL import Image

from ...diffusion.base_pipeline import PipelineUnit
from ..common import image_to_tensor, tensor_to_images, video_to_tensor
from .image import MASK_CHANNELS, check_image
from .units import VAE_TEMPORAL_SCALE, normalised_latents
from .vace import control_frames

if TYPE_CHECKING:
    from .pipeline import WanVideoPipeline

ANIMATE_INPUTS = ("animate_pose_video", "animate_face_video", "animate_inpaint_video", "animate_mask_video")
# Pixel frames of the reference image's latent slot, which the output does not show.
REFERENCE_FRAMES = VAE_TEMPORAL_SCALE


def fitted_character(image: Image.Image, height: int, width: int) -> torch.Tensor:
    """The character image scaled to fit ``height x width`` and centred on black, ``(1, 3, H, W)`` in ``[-1, 1]``
    (diffusers' ``WanAnimateImageProcessor`` with ``resize_mode="fill"``; LANCZOS, since that processor keeps its
    default resampling whatever the pipeline asks of it)."""
    image = image.convert("RGB")
    if image.size == (width, height):
        return image_to_tensor(image)
    wider = width / height < image.width / image.height
    size = (width, image.height * width // image.width) if wider else (image.width * height // image.height, height)
    canvas = Image.new("RGB", (width, height), 0)
    canvas.paste(image.resize(size, Image.Resampling.LANCZOS), (width // 2 - size[0] // 2, height // 2 - size[1] // 2))
    return image_to_tensor(canvas)


def fold_frame_mask(mask: torch.Tensor) -> torch.Tensor:
    """A per-pixel-frame mask ``(1, 1, 4k + 1, h, w)`` as ``MASK_CHANNELS`` channels per latent frame
    ``(1, 4, k + 1, h, w)``: the first frame repeated four times, then four frames per latent frame."""
    frames = torch.cat([mask[:, :, :1].repeat(1, 1, MASK_CHANNELS, 1, 1), mask[:, :, 1:]], dim=2)
    return frames.view(1, -1, MASK_CHANNELS, *mask.shape[3:]).transpose(1, 2)


class AnimateUnit(PipelineUnit):
    """Encodes the Animate inputs into ``y`` (reference frame and segment condition), ``pose_latents`` and
    ``face_pixel_values`` for a ``WanAnimateTransformer3DModel``; otherwise passes the image condition's ``y``
    through and gives None for the others.

    In training (``input_video`` given) the control videos are cut to the clip's length less 4 frames, as the
    reference trainer does.
    """

    def __init__(self) -> None:
        super().__init__(input_params=(*ANIMATE_INPUTS, "input_image", "height", "width", "num_frames", "y"),
                         output_params=("y", "pose_latents", "face_pixel_values"), onload_model_names=("vae",))

    def process(self, pipe: WanVideoPipeline, animate_pose_video: Sequence[Image.Image] | None,
                animate_face_video: Sequence[Image.Image] | None,
                animate_inpaint_video: Sequence[Image.Image] | None,
                animate_mask_video: Sequence[Image.Image] | None, input_image: Image.Image | None, height: int,
                width: int, num_frames: int, y: torch.Tensor | None) -> dict:
        videos = dict(zip(ANIMATE_INPUTS, (animate_pose_video, animate_face_video, animate_inpaint_video,
                                           animate_mask_video)))
        given = [name for name, value in videos.items() if value is not None]
        takes = pipe.takes_animate()  # unknown (None) in a stage without the transformer: the inputs decide
        if takes is False or (takes is None and not given):
            if given:
                raise ValueError(f"{', '.join(given)} given, but {pipe.describe_transformer()} is not a Wan2.2-Animate "
                                 "transformer; load Wan-AI/Wan2.2-Animate-14B or drop them")
            return {"y": y, "pose_latents": None, "face_pixel_values": None}
        missing = [name for name in ANIMATE_INPUTS[:2] if videos[name] is None]
        if missing or input_image is None:
            raise ValueError(f"Wan2.2-Animate needs input_image (the character), animate_pose_video and "
                             f"animate_face_video; {', '.join(missing) or 'input_image'} is missing")
        if (animate_inpaint_video is None) != (animate_mask_video is None):
            raise ValueError("replacement mode takes animate_inpaint_video (the background) and animate_mask_video "
                             "(white where the character goes) together: pass both, or neither to animate")
        if num_frames <= REFERENCE_FRAMES:
            raise ValueError(f"num_frames={num_frames} leaves no frame after the reference image's latent slot of "
                             f"{REFERENCE_FRAMES} frames; pass num_frames=4k+1 with k >= 2, e.g. 81 (77 frames out)")
        check_image(input_image, "input_image", "the character")
        frames = num_frames - REFERENCE_FRAMES
        pose = video_to_tensor(control_frames(animate_pose_video, "animate_pose_video", frames, width, height))
        pose_latents = normalised_latents(pipe, pose)
        # A stage without the transformer keeps the crops' size; animate_inputs resizes them alike.
        face_size = (pipe.dit.config.motion_encoder_size,) * 2 if pipe.dit is not None else None
        face = control_frames(animate_face_video, "animate_face_video", frames, *(face_size or
                                                                                 animate_face_video[0].size))
        reference = normalised_latents(pipe, fitted_character(input_image, height, width).unsqueeze(2))
        y = [torch.ones_like(reference[:, :MASK_CHANNELS]), reference]
        if animate_inpaint_video is None:
            segment = torch.zeros(1, 3, frames, height, width)
            keep = torch.zeros(1, 1, frames, height, width)
        else:
            segment = video_to_tensor(control_frames(animate_inpaint_video, "animate_inpaint_video", frames, width,
                                                     height))
            mask = control_frames(animate_mask_video, "animate_mask_video", frames, width, height)
            keep = 1 - video_to_tensor([frame.convert("L").convert("RGB") for frame in mask])[:, :1].add(1).div(2)
        latents = normalised_latents(pipe, segment)
        keep = torch.nn.functional.interpolate(keep[0].transpose(0, 1), size=latents.shape[3:], mode="nearest")
        condition = torch.cat([fold_frame_mask(keep.transpose(0, 1).unsqueeze(0)).to(latents), latents], dim=1)
        y = torch.cat([torch.cat(y, dim=1), condition], dim=2)
        return {"y": y.to(pipe.torch_dtype), "pose_latents": pose_latents.to(pipe.torch_dtype),
                "face_pixel_values": video_to_tensor(face).to(pipe.device, pipe.torch_dtype)}


def animate_sample_problems(pipe: WanVideoPipeline, inputs: set[str]) -> list[str]:
    """What is wrong with a sample's ``inputs`` for the loaded transformer: Animate inputs for another model, an
    Animate model without its pose and face videos, half of replacement mode's pair."""
    problems = []
    given = sorted(inputs & set(ANIMATE_INPUTS))
    if given and pipe.takes_animate() is False:
        problems.append(f"{', '.join(given)} given, but {pipe.describe_transformer()} is not Wan2.2-Animate")
    if pipe.takes_animate() and not set(ANIMATE_INPUTS[:2]) <= inputs:
        problems.append('Wan2.2-Animate renders from "animate_pose_video" and "animate_face_video": give both')
    if len(inputs & set(ANIMATE_INPUTS[2:])) == 1:
        problems.append('replacement mode takes "animate_inpaint_video" and "animate_mask_video" together')
    return problems


def animate_inputs(dit: torch.nn.Module, pose_latents: torch.Tensor, face_pixel_values: torch.Tensor,
                   blank_face: bool) -> dict[str, Any]:
    """The keyword inputs of ``WanAnimateTransformer3DModel`` for the pose and face; ``blank_face`` (the negative CFG
    branch) gives the face as all -1, as diffusers' pipeline does.

    Face frames cached by a stage that had no transformer keep their own size: they are resized here as the unit
    resizes them (back to 8-bit frames, which they were, then LANCZOS), so a split run trains on the same pixels.
    """
    size = dit.config.motion_encoder_size
    face = face_pixel_values
    if face.shape[-2:] != (size, size):
        crops = tensor_to_images((face[0].transpose(0, 1).float().cpu() + 1) / 2)
        face = video_to_tensor(control_frames(crops, "animate_face_video", len(crops), size, size))
    face = face.to(pose_latents.device, dit.dtype)
    if blank_face:
        face = torch.full_like(face, -1.0)
    return {"pose_hidden_states": pose_latents.to(dit.dtype), "face_pixel_values": face}
