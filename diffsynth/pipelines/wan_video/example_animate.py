"""A small drawn dataset for Wan2.2-Animate training: the example clips plus a pose and a face video each.

``metadata.csv`` gets the columns the reference's Animate scripts read: ``video,prompt,animate_pose_video,
animate_face_video`` (and with ``replace``, ``animate_inpaint_video,animate_mask_video``). The pose video is the clip
in grey (a stand-in for rendered skeletons), the face video the clip's centre square (a stand-in for face crops), the
background the clip's first frame held, the mask white on the left half (where the character goes). The input image
(the character) is each clip's first frame, as the reference takes it with ``--extra_inputs input_image``. Run
``python -m diffsynth.pipelines.wan_video.example_animate --output DIR`` to write one (``--animate2``: the
Wan2.2-Animate-2 columns, ``build_animate2_example_dataset``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from PIL import Image

from ...core.data.example_dataset import VIDEO_SIZE
from ...core.files import atomic_write_text
from .example_vace import drawn_clips, example_parser, grey_frames, half_mask, write_clip, write_metadata


def _centre_square(frame: Image.Image) -> Image.Image:
    side = min(frame.size)
    left, top = (frame.width - side) // 2, (frame.height - side) // 2
    return frame.crop((left, top, left + side, top + side))


def build_animate_example_dataset(folder: str | os.PathLike, num_videos: int = 2, num_frames: int = 9,
                                  size: tuple[int, int] = VIDEO_SIZE, seed: int = 0, replace: bool = False) -> Path:
    """Writes the example clips (``build_example_video_dataset``) with a pose video (``pose_<i>.mp4``) and a face video
    (``face_<i>.mp4``) per clip, and with ``replace`` a background (``background_<i>.mp4``) and a mask
    (``mask_<i>.mp4``).

    Returns:
        The metadata file (``--dataset_metadata_path``).

    Raises:
        DatasetError: A count below 1 or an unusable size (as ``build_example_video_dataset``).
    """
    metadata, clips = drawn_clips(folder, num_videos, num_frames, size, seed)
    folder = metadata.parent
    columns = ["video", "prompt", "animate_pose_video", "animate_face_video"]
    columns += ["animate_inpaint_video", "animate_mask_video"] if replace else []
    for index, (row, frames) in enumerate(clips):
        row.update(animate_pose_video=f"pose_{index:03d}.mp4", animate_face_video=f"face_{index:03d}.mp4")
        write_clip(folder / row["animate_pose_video"], grey_frames(frames))
        write_clip(folder / row["animate_face_video"], [_centre_square(frame) for frame in frames])
        if replace:
            row.update(animate_inpaint_video=f"background_{index:03d}.mp4", animate_mask_video=f"mask_{index:03d}.mp4")
            write_clip(folder / row["animate_inpaint_video"], [frames[0]] * len(frames))
            write_clip(folder / row["animate_mask_video"], half_mask(frames[0].size, len(frames)))
    return write_metadata(metadata, columns, [row for row, _ in clips])


def build_animate2_example_dataset(folder: str | os.PathLike, num_videos: int = 2, num_frames: int = 9,
                                   size: tuple[int, int] = VIDEO_SIZE, seed: int = 0) -> Path:
    """Writes the example clips with the columns of the reference's Wan2.2-Animate-2 scripts: a character image
    (``character_<i>.png``, the clip's first frame), a driving video (``driving_<i>.mp4``, the clip in grey) and
    ``animate2_prompt_ref`` (the clip's prompt). The rows go to ``metadata.json`` too, the file the reference's
    example dataset ships and its scripts name.

    Returns:
        The metadata file (``--dataset_metadata_path``), ``metadata.json``.
    """
    metadata, clips = drawn_clips(folder, num_videos, num_frames, size, seed)
    folder = metadata.parent
    for index, (row, frames) in enumerate(clips):
        row.update(animate2_reference_image=f"character_{index:03d}.png",
                   animate2_reference_video=f"driving_{index:03d}.mp4", animate2_prompt_ref=row["prompt"])
        frames[0].save(folder / row["animate2_reference_image"])
        write_clip(folder / row["animate2_reference_video"], grey_frames(frames))
    columns = ["video", "prompt", "animate2_reference_image", "animate2_reference_video", "animate2_prompt_ref"]
    rows = [row for row, _ in clips]
    write_metadata(metadata, columns, rows)
    return atomic_write_text(metadata.with_suffix(".json"), json.dumps(rows, indent=1))


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``--output DIR [--num_videos N] [--num_frames F] [--width W] [--height H] [--replace |
    --animate2]``."""
    parser = example_parser("Write a small drawn dataset for Wan2.2-Animate training.")
    parser.add_argument("--replace", action="store_true",
                        help="also write the replacement-mode columns animate_inpaint_video, animate_mask_video")
    parser.add_argument("--animate2", action="store_true",
                        help="write Wan2.2-Animate-2's columns instead (animate2_reference_image, "
                             "animate2_reference_video, animate2_prompt_ref) and metadata.json")
    args = parser.parse_args(argv)
    if args.animate2:
        metadata = build_animate2_example_dataset(args.output, args.num_videos, args.num_frames,
                                                  (args.width, args.height))
        print(f"wrote {args.num_videos} clips with character images and driving videos to {metadata.parent}")
        return 0
    metadata = build_animate_example_dataset(args.output, args.num_videos, args.num_frames,
                                             (args.width, args.height), replace=args.replace)
    print(f"wrote {args.num_videos} clips with pose and face videos to {metadata.parent}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
