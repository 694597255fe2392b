"""The inputs of the Wan Fun Control and Control-Camera models (PAI ``Wan2.1-Fun-*-Control``,
``Wan2.1-Fun-V1.1-*-Control[-Camera]``, ``Wan2.2-Fun-A14B-Control[-Camera]``), as the reference composes them.

Which model is loaded is read from the transformer (``fun_kind``):

- ``"control"``: ``in_channels`` is the latents' channels plus 16 control latents plus the image condition (16
  latents for Wan2.1, 4 mask channels and 16 latents for Wan2.2). ``y`` is the normalised VAE latents of
  ``control_video`` followed by the image condition of ``input_image`` (``ImageConditionUnit``'s ``y``, keeping its
  last channels) or zeros without one. Without an image, a transformer with CLIP cross-attention reads zero CLIP
  features (257 tokens, as the ViT-H/14 gives). The reference zeroes the image condition whenever there are no CLIP
  features, so for Wan2.2 (no CLIP encoder) it ignores ``input_image``; here the image is used, as its channels are
  there for it (its training scripts pass no image, so training is the same).
- ``"camera"``: the transformer has the camera adapter. ``camera_control_direction`` becomes the Plücker embedding of
  ``camera.py``; the image condition is the first frame's latents (a one-frame video) on latent frame 0 and zeros
  after it for Wan2.1 (16 channels), ``ImageConditionUnit``'s mask and latents for Wan2.2 (20 channels).
- ``reference_image`` (Fun-V1.1 Control, Wan2.2-Fun-A14B-Control): its latents go to ``ref_conv``, and with a CLIP
  encoder its CLIP features replace the first frame's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from PIL import Image

from ...diffusion.base_pipeline import PipelineUnit
from ..common import video_to_tensor
from .camera import CAMERA_SPEED, camera_latents, camera_poses, check_direction, plucker_embedding
from .image import MASK_CHANNELS, ImageEmbedderUnit, check_image
from .units import normalised_latents

if TYPE_CHECKING:
    from .pipeline import WanVideoPipeline

# Control latents have the Wan2.1 VAE's channels; Wan2.2's image condition adds the 4-channel mask.
CONTROL_CHANNELS = 16
# Tokens of the ViT-H/14 CLIP features the Fun models were trained with (zeros stand in without an image).
CLIP_TOKENS = 257


def fun_kind(dit: torch.nn.Module | None) -> str | None:
    """``"camera"`` (a Control-Camera transformer), ``"control"`` (a Fun Control one) or None, told from its config."""
    if dit is None:
        return None
    config = dit.config
    if config.get("camera_channels"):
        return "camera"
    if "in_channels" not in config:  # Wan2.2-Animate-2's config names its widths in_dim / out_dim
        return None
    extra = config.in_channels - config.out_channels
    return "control" if extra in (2 * CONTROL_CHANNELS, 2 * CONTROL_CHANNELS + MASK_CHANNELS) else None


def require_transformer(pipe: WanVideoPipeline, name: str) -> None:
    """A ``ValueError`` when ``name`` is given to a pipeline without its transformer (a split run's first stage that
    does not load it): the transformer's input width decides how the Fun inputs are laid out."""
    if pipe.dit is None:
        raise ValueError(f"{name} needs the transformer loaded: its input channels decide how the Fun inputs are laid "
                         "out; name the transformer in --model_id_with_origin_paths of the --task sft:data_process "
                         "stage too (it stays frozen there), or train in one stage")


def fun_sample_problems(pipe: WanVideoPipeline, inputs: set[str]) -> list[str]:
    """What a sample's Fun inputs (``inputs``: the names it gives) lack or give in vain for the loaded transformer."""
    kind, problems = fun_kind(pipe.dit), []
    if kind == "control" and "control_video" not in inputs:
        problems.append(f'{pipe.describe_transformer()} is a Wan Fun Control model: give a "control_video"')
    if kind != "control" and "control_video" in inputs:
        problems.append(f'"control_video" was given, but {pipe.describe_transformer()} is not a Fun Control model')
    if "reference_image" in inputs and getattr(pipe.dit, "ref_conv", None) is None:
        problems.append(f'"reference_image" was given, but {pipe.describe_transformer()} takes none')
    if kind != "camera" and inputs & {"camera_control_direction", "camera_control_speed"}:
        problems.append(f'a camera motion was given, but {pipe.describe_transformer()} has no camera adapter')
    return problems


def _normalised_latents(pipe: WanVideoPipeline, frames: Sequence[Image.Image]) -> torch.Tensor:
    return normalised_latents(pipe, video_to_tensor(frames))


def _sized(image: Image.Image, width: int, height: int) -> Image.Image:
    # PIL's default filter, as the reference resizes these images.
    image = image.convert("RGB")
    return image if image.size == (width, height) else image.resize((width, height))


class FunControlUnit(PipelineUnit):
    """Puts the latents of ``control_video`` in front of the image condition ``y`` (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(input_params=("control_video", "height", "width", "num_frames", "y", "clip_feature"),
                         output_params=("y", "clip_feature"), onload_model_names=("vae",))

    def process(self, pipe: WanVideoPipeline, control_video: Sequence[Image.Image] | None, height: int, width: int,
                num_frames: int, y: torch.Tensor | None, clip_feature: torch.Tensor | None) -> dict:
        kind = fun_kind(pipe.dit)
        if control_video is None:
            if kind == "control":
                raise ValueError(f"{pipe.describe_transformer()} is a Wan Fun Control model and needs "
                                 "control_video=[PIL frames] (e.g. depth or edge maps of the video to make)")
            return {"y": y, "clip_feature": clip_feature}
        require_transformer(pipe, "control_video")
        if kind != "control":
            raise ValueError(f"control_video was given, but {pipe.describe_transformer()} is not a Wan Fun Control "
                             "model; load e.g. PAI/Wan2.1-Fun-V1.1-1.3B-Control, or drop control_video")
        if isinstance(control_video, Image.Image) or len(control_video) < num_frames:
            count = 1 if isinstance(control_video, Image.Image) else len(control_video)
            raise ValueError(f"control_video has {count} frame(s), fewer than num_frames={num_frames}; pass a list of "
                             "at least num_frames PIL frames")
        control = _normalised_latents(pipe, [_sized(frame, width, height) for frame in control_video[:num_frames]])
        image_channels = pipe.dit.config.in_channels - pipe.dit.config.out_channels - CONTROL_CHANNELS
        if y is None:
            image = control.new_zeros(1, image_channels, *control.shape[2:])
            if pipe.takes_image_embedding():
                clip_feature = torch.zeros(1, CLIP_TOKENS, pipe.dit.config.image_dim, device=pipe.device,
                                           dtype=pipe.torch_dtype)
        else:
            image = y[:, -image_channels:].to(control)
        return {"y": torch.cat([control, image], dim=1).to(pipe.torch_dtype), "clip_feature": clip_feature}


class FunCameraUnit(PipelineUnit):
    """The Control-Camera models' camera latents, and (Wan2.1) their one-frame image condition."""

    def __init__(self) -> None:
        super().__init__(input_params=("camera_control_direction", "camera_control_speed", "camera_control_origin",
                                       "input_image", "height", "width", "num_frames", "y"),
                         output_params=("camera_latents", "y"), onload_model_names=("vae",))

    def process(self, pipe: WanVideoPipeline, camera_control_direction: str | None, camera_control_speed: float | None,
                camera_control_origin: Sequence[float] | None, input_image: Image.Image | None, height: int,
                width: int, num_frames: int, y: torch.Tensor | None) -> dict:
        if fun_kind(pipe.dit) != "camera":
            if camera_control_direction is not None:
                require_transformer(pipe, "camera_control_direction")
                raise ValueError(f"camera_control_direction was given, but {pipe.describe_transformer()} has no camera "
                                 "adapter; load a Control-Camera model (e.g. PAI/Wan2.1-Fun-V1.1-1.3B-Control-Camera)")
            return {"camera_latents": None, "y": y}
        camera = None
        if camera_control_direction is not None:
            speed = CAMERA_SPEED if camera_control_speed is None else float(camera_control_speed)
            poses = camera_poses(check_direction(camera_control_direction), num_frames, speed, camera_control_origin)
            camera = camera_latents(plucker_embedding(poses, height, width)).to(pipe.device, pipe.torch_dtype)
        if input_image is None or y is None or y.shape[1] == pipe.dit.config.in_channels - pipe.latent_channels:
            return {"camera_latents": camera, "y": y}
        first = _normalised_latents(pipe, [_sized(check_image(input_image), width, height)])
        image = first.new_zeros(pipe.latent_shape(height, width, num_frames))
        image[:, :, :1] = first
        return {"camera_latents": camera, "y": image.to(pipe.torch_dtype)}


class FunReferenceUnit(PipelineUnit):
    """Encodes ``reference_image`` into ``reference_latents`` (for ``ref_conv``) and, with a CLIP encoder, into the
    CLIP features the transformer reads."""

    def __init__(self) -> None:
        super().__init__(input_params=("reference_image", "height", "width", "clip_feature"),
                         output_params=("reference_latents", "clip_feature"),
                         onload_model_names=("vae", "image_encoder"))

    def process(self, pipe: WanVideoPipeline, reference_image: Image.Image | None, height: int, width: int,
                clip_feature: torch.Tensor | None) -> dict[str, Any]:
        if reference_image is None:
            return {"reference_latents": None, "clip_feature": clip_feature}
        require_transformer(pipe, "reference_image")
        if getattr(pipe.dit, "ref_conv", None) is None:
            raise ValueError(f"reference_image was given, but {pipe.describe_transformer()} takes none; load a "
                             "Fun-V1.1 Control model (e.g. PAI/Wan2.1-Fun-V1.1-1.3B-Control), or drop reference_image")
        if not isinstance(reference_image, Image.Image):
            raise TypeError(f"reference_image must be one PIL image, got {type(reference_image).__name__}; load it "
                            "with PIL.Image.open(path)")
        image = _sized(reference_image, width, height)
        latents = _normalised_latents(pipe, [image]).to(pipe.torch_dtype)
        if pipe.image_encoder is not None and pipe.takes_image_embedding():
            clip_feature = ImageEmbedderUnit().process(pipe, image, None)["clip_feature"]
        return {"reference_latents": latents, "clip_feature": clip_feature}
