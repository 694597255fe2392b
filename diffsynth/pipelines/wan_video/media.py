"""Writing a Wan clip to a file: ``.mp4`` through PyAV or an animated ``.gif`` through Pillow."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from PIL import Image

from ..common import mux_video_frames


def save_video(frames: Sequence[Image.Image], path: str | Path, fps: int = 15, quality: int = 8) -> Path:
    """Writes frames as an ``.mp4`` (PyAV; H.264, or MPEG-4 Part 2 where FFmpeg lacks libx264) or an animated
    ``.gif`` (Pillow), chosen by the suffix.

    Args:
        frames: PIL images of one size.
        path: Output file; ``.mp4`` or ``.gif``.
        fps: Frames per second.
        quality: For H.264, 0 (smallest file) to 10 (best); mapped to the encoder's CRF.
    """
    from ...core.files import atomic_write

    path = Path(path)
    if path.suffix.lower() == ".gif":
        return atomic_write(path, lambda temporary: frames[0].save(
            temporary, format="GIF", save_all=True, append_images=list(frames[1:]), duration=int(1000 / fps), loop=0))
    if path.suffix.lower() != ".mp4":
        raise ValueError(f"save_video: {path} must end in .mp4 or .gif")

    def write(temporary: Path) -> None:
        import av

        with av.open(str(temporary), mode="w", format="mp4") as container:
            mux_video_frames(container, frames, fps, quality)

    return atomic_write(path, write)
