"""A small drawn dataset for Wan VACE training: the example clips plus a control video and a reference image each.

``metadata.csv`` gets the columns the reference's VACE scripts read: ``video,prompt,vace_video,vace_reference_image``
(and with ``mask``, ``vace_video_mask``). The control video is the clip in grey (a stand-in for depth or pose
videos), the reference image its first frame, the mask white on the clip's left half (generate) and black on the
right (keep). Run ``python -m diffsynth.pipelines.wan_video.example_vace --output DIR`` to write one.
"""

from __future__ import annotations

import argparse
import csv
import functools
import io
import os
import random
from collections.abc import Sequence
from pathlib import Path

from PIL import Image

from ...core.data.example_dataset import VIDEO_SIZE, build_example_video_dataset, draw_example_video, write_mp4
from ...core.files import atomic_write, atomic_write_text


def grey_frames(frames: list[Image.Image]) -> list[Image.Image]:
    """The frames in grey: a stand-in for a depth or pose video drawn from the clip."""
    return [frame.convert("L").convert("RGB") for frame in frames]


def write_clip(path: Path, frames: list[Image.Image]) -> None:
    """Writes the frames as an ``.mp4`` at ``path`` (atomically)."""
    atomic_write(path, lambda temporary: write_mp4(temporary, frames))


def _save_png(image: Image.Image, path: Path) -> None:
    image.save(path, format="PNG")


def half_mask(size: tuple[int, int], count: int) -> list[Image.Image]:
    """``count`` mask frames of ``size``: white on the left half, black on the right."""
    mask = Image.new("RGB", size, (0, 0, 0))
    mask.paste((255, 255, 255), (0, 0, size[0] // 2, size[1]))
    return [mask] * count


def drawn_clips(folder: str | os.PathLike, num_videos: int, num_frames: int, size: tuple[int, int],
                seed: int) -> tuple[Path, list[tuple[dict[str, str], list[Image.Image]]]]:
    """Writes the example clips (``build_example_video_dataset``); returns their metadata file and each row with its
    clip's frames (drawn again, as that function drew them), for a control dataset to add its columns."""
    metadata = build_example_video_dataset(folder, num_videos=num_videos, num_frames=num_frames, size=size, seed=seed)
    rng = random.Random(seed)
    rows = list(csv.DictReader(io.StringIO(metadata.read_text())))
    return metadata, [(row, draw_example_video(rng, num_frames, size)[0]) for row in rows]


def write_metadata(metadata: Path, columns: Sequence[str], rows: Sequence[dict[str, str]]) -> Path:
    """Rewrites ``metadata`` (a ``metadata.csv``) with ``rows`` under ``columns``, atomically."""
    text = io.StringIO()
    writer = csv.DictWriter(text, list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return atomic_write_text(metadata, text.getvalue())


def example_parser(description: str) -> argparse.ArgumentParser:
    """The flags of every drawn control dataset's command line: ``--output``, ``--num_videos``, ``--num_frames``,
    ``--width`` and ``--height``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--output", required=True, help="folder to write the files and metadata.csv into")
    parser.add_argument("--num_videos", type=int, default=2, help="how many clips to draw (default 2)")
    parser.add_argument("--num_frames", type=int, default=9, help="frames per clip (default 9)")
    parser.add_argument("--width", type=int, default=VIDEO_SIZE[0], help="clip width in pixels, even")
    parser.add_argument("--height", type=int, default=VIDEO_SIZE[1], help="clip height in pixels, even")
    return parser


def build_vace_example_dataset(folder: str | os.PathLike, num_videos: int = 2, num_frames: int = 9,
                               size: tuple[int, int] = VIDEO_SIZE, seed: int = 0, mask: bool = False) -> Path:
    """Writes the example clips (``build_example_video_dataset``) with a control video (``vace_<i>.mp4``), a
    reference image (``reference_<i>.png``) and with ``mask`` a mask video (``mask_<i>.mp4``) per clip.

    Returns:
        The metadata file (``--dataset_metadata_path``).

    Raises:
        DatasetError: A count below 1 or an unusable size (as ``build_example_video_dataset``).
    """
    metadata, clips = drawn_clips(folder, num_videos, num_frames, size, seed)
    folder = metadata.parent
    columns = ["video", "prompt", "vace_video", "vace_reference_image", *(("vace_video_mask",) if mask else ())]
    for index, (row, frames) in enumerate(clips):
        control, reference = f"vace_{index:03d}.mp4", f"reference_{index:03d}.png"
        write_clip(folder / control, grey_frames(frames))
        atomic_write(folder / reference, functools.partial(_save_png, frames[0]))
        row.update(vace_video=control, vace_reference_image=reference)
        if mask:
            row["vace_video_mask"] = f"mask_{index:03d}.mp4"
            write_clip(folder / row["vace_video_mask"], half_mask(frames[0].size, len(frames)))
    return write_metadata(metadata, columns, [row for row, _ in clips])


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``--output DIR [--num_videos N] [--num_frames F] [--width W] [--height H] [--mask]``."""
    parser = example_parser("Write a small drawn dataset for Wan VACE training.")
    parser.add_argument("--mask", action="store_true", help="also write a vace_video_mask column")
    args = parser.parse_args(argv)
    metadata = build_vace_example_dataset(args.output, args.num_videos, args.num_frames, (args.width, args.height),
                                          mask=args.mask)
    print(f"wrote {args.num_videos} clips with control videos and reference images to {metadata.parent}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
