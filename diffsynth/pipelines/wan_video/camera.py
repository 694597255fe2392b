"""The camera input of the Wan Fun Control-Camera models, as the reference encodes it: a named camera motion turned
into per-frame poses, the poses into a Plücker embedding of every pixel's ray, and that folded to the latent frames.

A pose is the 19 numbers of a CameraCtrl-style pose line: ``[_, fx, fy, cx, cy, _, _, w2c]`` with the intrinsics
relative to the frame size and ``w2c`` a 3x4 world-to-camera matrix, row by row. A motion starts at
``CAMERA_ORIGIN`` and moves one of its entries by ``speed`` per frame: entry 9 for left / right, 13 for up / down,
18 (the depth translation) for in / out, as the reference's ``generate_camera_coordinates`` does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# The reference's default first pose (``camera_control_origin``).
CAMERA_ORIGIN = (0, 0.532139961, 0.946026558, 0.5, 0.5, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0)
# The reference's default ``camera_control_speed``.
CAMERA_SPEED = 1 / 54
# Which pose entry a direction word moves, and which way.
_MOVES = {"Left": (9, 1.0), "Right": (9, -1.0), "Up": (13, 1.0), "Down": (13, -1.0), "In": (18, -1.0), "Out": (18, 1.0)}
DIRECTIONS = ("Left", "Right", "Up", "Down", "LeftUp", "LeftDown", "RightUp", "RightDown", "In", "Out")
# The aspect ratio the poses' intrinsics were written for (1280x720 footage).
_POSE_ASPECT = 1280 / 720
# Pixel frames per latent frame (the VAE's temporal compression).
_FOLD = 4


def check_direction(direction: object) -> str:
    """``direction`` if it names a motion, else a ``ValueError`` listing them."""
    if not isinstance(direction, str) or not any(word in direction for word in _MOVES):
        raise ValueError(f"camera_control_direction={direction!r} must name a camera motion, one of "
                         f"{', '.join(DIRECTIONS)}")
    return direction


def camera_poses(direction: str, num_frames: int, speed: float = CAMERA_SPEED,
                 origin: Sequence[float] | None = None) -> list[list[float]]:
    """``num_frames`` pose lines of a camera that starts at ``origin`` and moves toward ``direction``.

    Raises:
        ValueError: ``origin`` is not 19 numbers, or ``direction`` names no motion.
    """
    check_direction(direction)
    pose = [float(value) for value in (CAMERA_ORIGIN if origin is None else origin)]
    if len(pose) != len(CAMERA_ORIGIN):
        raise ValueError(f"camera_control_origin has {len(pose)} numbers; a pose line has {len(CAMERA_ORIGIN)}, "
                         f"e.g. {CAMERA_ORIGIN}")
    poses = [pose]
    while len(poses) < num_frames:
        pose = list(pose)
        for word, (index, sign) in _MOVES.items():
            if word in direction:
                pose[index] += sign * speed
        poses.append(pose)
    return poses


def plucker_embedding(poses: list[list[float]], height: int, width: int) -> torch.Tensor:
    """The ``(frames, height, width, 6)`` Plücker coordinates ``(o x d, d)`` of each pixel's ray, with the poses made
    relative to the first and the intrinsics fitted to ``width / height`` (float32)."""
    table = torch.tensor(poses, dtype=torch.float64)
    fx, fy, cx, cy = table[:, 1], table[:, 2], table[:, 3], table[:, 4]
    if _POSE_ASPECT > width / height:
        fx = height * _POSE_ASPECT * fx / width
    else:
        fy = width / _POSE_ASPECT * fy / height
    fx, fy, cx, cy = (value.float() for value in (fx * width, fy * height, cx * width, cy * height))
    world_to_camera = torch.eye(4, dtype=torch.float64).repeat(len(poses), 1, 1)
    world_to_camera[:, :3] = table[:, 7:].reshape(-1, 3, 4)
    # The first camera at the origin, the others relative to it.
    relative = world_to_camera[0] @ torch.linalg.inv(world_to_camera)
    relative[0] = torch.eye(4, dtype=torch.float64)
    relative = relative.float()
    rows, columns = torch.meshgrid(torch.arange(height, dtype=torch.float32) + 0.5,
                                   torch.arange(width, dtype=torch.float32) + 0.5, indexing="ij")
    directions = torch.stack([(columns[None] - cx[:, None, None]) / fx[:, None, None],
                              (rows[None] - cy[:, None, None]) / fy[:, None, None],
                              torch.ones(len(poses), height, width)], dim=-1)
    directions = directions / directions.norm(dim=-1, keepdim=True)
    rays = torch.einsum("fhwj,fij->fhwi", directions, relative[:, :3, :3])
    origins = relative[:, None, None, :3, 3].expand_as(rays)
    return torch.cat([torch.linalg.cross(origins, rays, dim=-1), rays], dim=-1)


def camera_latents(plucker: torch.Tensor) -> torch.Tensor:
    """A ``(frames, H, W, 6)`` embedding folded to the latent frames: ``(1, 24, (frames + 3) / 4, H, W)``, the first
    frame repeated 4 times and each group of 4 frames stacked per channel (channel ``4 * c + k`` holds coordinate ``c``
    of the group's frame ``k``)."""
    video = plucker.permute(3, 0, 1, 2)  # (6, frames, H, W)
    video = torch.cat([video[:, :1].repeat(1, _FOLD, 1, 1), video[:, 1:]], dim=1)
    channels, frames, height, width = video.shape
    grouped = video.reshape(channels, frames // _FOLD, _FOLD, height, width).transpose(0, 1)
    return grouped.reshape(frames // _FOLD, channels * _FOLD, height, width).transpose(0, 1).unsqueeze(0)
